"""A model's family, read from what its registered class declares (``is_video``, see
``models.capabilities``), and the one check that a model fits the script it was given to.

* image: class-conditional images in, trained by train.py and sampled by sample.py;
* video: clips and captions in, trained by train_video.py and sampled by sample_video.py.
"""

from ..config import TrainConfig
from ..config.video_schema import VideoTrainConfig
from ..errors import ConfigError
from ..families import family_class_names, is_family
from ..models import MODELS
from ..models.capabilities import model_family

SCRIPTS = {"image": {"train": "train.py", "sample": "sample.py"},
           "video": {"train": "train_video.py", "sample": "sample_video.py"}}


def config_family(cfg) -> str:
    """"video" for a train_video.py config (``VideoTrainConfig``), else "image"."""
    return "video" if isinstance(cfg, VideoTrainConfig) else "image"


def config_schema(tree: dict) -> type:
    """The schema of a raw config tree (a YAML file's): ``VideoTrainConfig`` when its ``model.name``
    is a registered video model or it names a ``model.pipeline``, or (an unregistered name) when it has
    a ``text_encoder`` section; else ``TrainConfig``."""
    model = tree.get("model") or {}
    name = model.get("name")
    if is_family(name) or model.get("pipeline"):  # a diffusers family (or its pipeline): trained by train_video.py
        return VideoTrainConfig
    video = model_family(name) == "video" if name in MODELS else "text_encoder" in tree
    return VideoTrainConfig if video else TrainConfig


def check_model_family(name: str, family: str, *, role: str = "train", subject: str = "") -> None:
    """A ConfigError unless ``name`` is a registered model of ``family`` ("image" or "video"), naming
    the script that takes it. ``role`` ("train" or "sample") picks the scripts the message names;
    ``subject`` says where the name comes from (default: "'model.name' '<name>'")."""
    if name in MODELS and model_family(name) == family:
        return
    if is_family(name) and family == "video":  # the diffusers families train as clips (images: 1 frame)
        return
    subject = subject or f"'model.name' {name!r}"
    names = ", ".join(sorted(n for n in MODELS if model_family(n) == family))
    script = SCRIPTS[family][role]
    if is_family(name) and family == "image":
        raise ConfigError(f"{subject} is a diffusers class of the families trained today: use "
                          f"{SCRIPTS['video'][role]} (the image families Flux and SD3 train there on 1-frame clips).")
    if name not in MODELS:
        families = (f"; or a diffusers class of the families trained today: {', '.join(family_class_names())}"
                    if family == "video" else "")
        raise ConfigError(f"{subject} is not a registered model; {family} models are: {names}{families}.")
    other = model_family(name)
    article = "an" if other == "image" else "a"
    raise ConfigError(f"{subject} is {article} {other} model (it declares is_video = {other == 'video'}): use "
                      f"{SCRIPTS[other][role]}. {script} {role}s {family} models: {names}.")
