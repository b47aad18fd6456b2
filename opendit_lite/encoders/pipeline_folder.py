"""A diffusers pipeline folder (``model_index.json`` and one sub-folder per component, as
``save_pretrained`` writes a released model): its checks, its components loaded without the
transformers, and a fingerprint of what latents and caption states extracted from it depend on.

* ``read_pipeline_index(folder)``: the folder's ``model_index.json``, with a ConfigError naming what
  is wrong when the folder is not a pipeline (a model folder, a missing component folder, a text
  encoder without its tokenizer); the one reader of a pipeline folder's index (training's
  ``builders/pipeline.py``, the export's ``interop/pipeline_links.py``), ``components`` its parts;
* ``load_pipeline(folder, ...)``: the pipeline object (its own class, so its ``encode_prompt``, packing
  helpers, scale factors and scheduler are the released ones) with its transformers left out, its
  text encoders optionally left out, and its VAE optionally built on the meta device from its config
  (no weights: the pipeline's scale factors only);
* ``pipeline_fingerprint(folder)``: a hash of everything but the transformers (configs and
  tokenizer files by content, weights by name and size), recorded with extracted latents.

Nothing here imports diffusers or transformers at import time.
"""

import hashlib
import importlib
import inspect
import json
import os
from typing import Any, Dict, Optional, Sequence, Tuple

import torch

from ..config.paths import INDEX, check_pipeline_path
from ..errors import ConfigError

TRANSFORMERS = ("transformer", "transformer_2")
# Files of a tokenizer saved by save_pretrained (any one of them makes a tokenizer folder).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "spiece.model", "tokenizer.model", "vocab.json",
                   "vocab.txt")
_SMALL = 1 << 22  # files up to 4 MiB are hashed by content, larger ones (weights) by name and size


def has_tokenizer(folder: str) -> bool:
    """Whether ``folder`` holds a saved tokenizer."""
    return os.path.isdir(folder) and any(os.path.isfile(os.path.join(folder, f)) for f in TOKENIZER_FILES)


def components(index: Dict[str, Any]) -> Dict[str, Tuple[str, str]]:
    """Component name -> (library, class) of a model index, the null entries left out."""
    return {name: (value[0], value[1]) for name, value in index.items()
            if not name.startswith("_") and isinstance(value, (list, tuple)) and len(value) == 2 and value[0]}


def read_pipeline_index(folder: str, what: str = "'model.pipeline'") -> Dict[str, Any]:
    """``folder``'s model index, after checking that it is a whole diffusers pipeline folder."""
    check_pipeline_path(folder, what)
    path = os.path.join(folder, INDEX)
    try:
        with open(path) as f:
            index = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{what}: {path} cannot be read as JSON ({e}); it should be the model_index.json "
                          f"save_pretrained wrote.") from None
    if not isinstance(index, dict) or not isinstance(index.get("_class_name"), str):
        raise ConfigError(f"{what}: {path} names no pipeline class (_class_name); it should be the model_index.json "
                          f"save_pretrained wrote.")
    parts = components(index)
    missing = [name for name in parts if not os.path.isdir(os.path.join(folder, name))]
    if "transformer" not in parts:
        missing.append("transformer")
    if missing:
        raise ConfigError(f"{what} {folder!r} lacks the component folder(s) {', '.join(sorted(set(missing)))} that its "
                          f"model_index.json lists: copy the whole pipeline folder.")
    for name in parts:
        if not name.startswith("text_encoder"):
            continue
        tokenizer = "tokenizer" + name[len("text_encoder"):]
        if tokenizer not in parts or not has_tokenizer(os.path.join(folder, tokenizer)):
            raise ConfigError(f"{what} {folder!r} has a text encoder {name}/ but no tokenizer for it ({tokenizer}/ "
                              f"with tokenizer files): captions would be encoded as unknown tokens. Copy the "
                              f"pipeline's {tokenizer}/ folder too.")
    return index


def component_class(library: str, name: str) -> type:
    """The class ``name`` of ``library`` ("diffusers", "transformers"), as a model index names it."""
    module = importlib.import_module(library)
    cls = getattr(module, name, None)
    if cls is None:
        raise ConfigError(f"the installed {library} has no class {name!r}, which the pipeline's model_index.json "
                          f"names; install the {library} version the pipeline was saved with.")
    return cls


def _load_component(folder: str, name: str, library: str, class_name: str, device, dtype: Optional[torch.dtype],
                    meta: bool) -> Any:
    path = os.path.join(folder, name)
    cls = component_class(library, class_name)
    if meta:  # the module from its config on the meta device: its attributes, no weights
        with torch.device("meta"):
            return cls.from_config(cls.load_config(path))
    if not isinstance(cls, type) or not issubclass(cls, torch.nn.Module):  # schedulers, tokenizers
        return cls.from_pretrained(path, local_files_only=True)
    kwargs = {"local_files_only": True}
    if dtype is not None:
        kwargs["torch_dtype" if library == "diffusers" else "dtype"] = dtype
    try:
        model = cls.from_pretrained(path, **kwargs)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot load the pipeline's {name} ({class_name}) from {path!r}: {e}") from None
    return model.to(device).eval().requires_grad_(False)


def load_pipeline(folder: str, device="cpu", text_dtype: Optional[torch.dtype] = None, text: bool = True,
                  meta_vae: bool = False, skip: Sequence[str] = TRANSFORMERS, pipeline_class: Optional[str] = None):
    """The pipeline of ``folder`` (``read_pipeline_index`` checks it) with its components but ``skip``
    (the transformers) loaded, frozen, on ``device``: the text encoders in ``text_dtype`` (None: as
    saved), or left out with their tokenizers when not ``text``; the VAE on the meta device when
    ``meta_vae`` (the pipeline's scale factors, no weights). ``pipeline_class``: the class to build it
    as (None: the index's), given the folder's components and settings that class takes (its optional
    components the folder lacks left None)."""
    index = read_pipeline_index(folder)
    pipeline_cls = component_class("diffusers", pipeline_class or index["_class_name"])
    params = inspect.signature(pipeline_cls.__init__).parameters
    kwargs: Dict[str, Any] = {}
    for name, (library, class_name) in components(index).items():
        if name in skip or (not text and name.startswith(("text_encoder", "tokenizer"))) or name not in params:
            continue
        kwargs[name] = _load_component(folder, name, library, class_name, device,
                                       text_dtype if name.startswith("text_encoder") else None,
                                       meta=meta_vae and name == "vae")
    for name, value in index.items():  # the pipeline's own settings (Wan 2.2's boundary_ratio, ...)
        if not name.startswith("_") and name not in kwargs and name in params and not isinstance(value, list):
            kwargs[name] = value
    for name, p in params.items():  # the components left out
        if name not in kwargs and name != "self" and p.default is inspect.Parameter.empty:
            kwargs[name] = None
    return pipeline_cls(**kwargs)


def pipeline_fingerprint(folder: str) -> str:
    """A hash of ``folder``'s files outside its transformers: what latents and caption states encoded
    with its VAE and text encoders depend on (small files by content, weights by name and size)."""
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not (root == folder and d in TRANSFORMERS))
        for name in sorted(files):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder)
            if rel == INDEX:
                with open(path) as f:  # the index without the transformers' entries and versions
                    index = {k: v for k, v in json.load(f).items() if k not in TRANSFORMERS and not k.startswith("_")}
                digest.update(f"{rel}\0{json.dumps(index, sort_keys=True)}\0".encode())
                continue
            size = os.path.getsize(path)
            digest.update(f"{rel}\0{size}\0".encode())
            if size <= _SMALL and not name.endswith((".safetensors", ".bin")):
                with open(path, "rb") as f:
                    digest.update(f.read())
    return digest.hexdigest()[:16]
