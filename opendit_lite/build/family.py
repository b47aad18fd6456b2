"""A model's family, read from what its registered class declares (``is_video``, see
``models.capabilities``), and the one check that a model fits the script it was given to.

* image: class-conditional images in, trained by train.py and sampled by sample.py;
* video: clips and captions in, trained by train_video.py and sampled by sample_video.py.
"""

from ..config import TrainConfig
from ..config.video_schema import VideoTrainConfig
from ..errors import ConfigError
from ..models import MODELS
from ..models.capabilities import model_family

SCRIPTS = {"image": {"train": "train.py", "sample": "sample.py"},
           "video": {"train": "train_video.py", "sample": "sample_video.py"}}


def config_family(cfg) -> str:
    """"video" for a train_video.py config (``VideoTrainConfig``), else "image"."""
    return "video" if isinstance(cfg, VideoTrainConfig) else "image"


def config_schema(tree: dict) -> type:
    """The schema of a raw config tree (a YAML file's): ``VideoTrainConfig`` when its ``model.name``
    is a registered video model, or (an unregistered name) when it has a ``text_encoder`` section;
    else ``TrainConfig``."""
    name = (tree.get("model") or {}).get("name")
    video = model_family(name) == "video" if name in MODELS else "text_encoder" in tree
    return VideoTrainConfig if video else TrainConfig


def check_model_family(name: str, family: str, *, role: str = "train", subject: str = "") -> None:
    """A ConfigError unless ``name`` is a registered model of ``family`` ("image" or "video"), naming
    the script that takes it. ``role`` ("train" or "sample") picks the scripts the message names;
    ``subject`` says where the name comes from (default: "'model.name' '<name>'")."""
    if name in MODELS and model_family(name) == family:
        return
    subject = subject or f"'model.name' {name!r}"
    names = ", ".join(sorted(n for n in MODELS if model_family(n) == family))
    script = SCRIPTS[family][role]
    if name not in MODELS:
        raise ConfigError(f"{subject} is not a registered model; {family} models are: {names}.")
    other = model_family(name)
    article = "an" if other == "image" else "a"
    raise ConfigError(f"{subject} is {article} {other} model (it declares is_video = {other == 'video'}): use "
                      f"{SCRIPTS[other][role]}. {script} {role}s {family} models: {names}.")
