"""The files of pretrained folders, going out and coming in.

* ``make_readable``: diffusers' ``save_pretrained`` writes its weights through a private temporary
  file (mode 0600) but its ``config.json`` as a plain file (0644 under the usual umask 022), so an
  export shared with other users would have a config they can read and weights they cannot; this
  gives every file the mode a plain file gets (0666 less the umask).
* ``check_pretrained_folder``: a folder about to be read with ``from_pretrained`` must hold a
  config and safetensors weights. Pickled weights (``.bin``, ``.pt``) are refused before any loader
  sees them: unpickling runs code, and the loaders' own refusal is a traceback.
* ``LORA_WEIGHT_NAME``: the file a LoRA export writes and diffusers' LoRA loaders read (a name the
  export script checks before torch is imported).
"""

import os

from ..errors import ConfigError

PICKLED = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
LORA_WEIGHT_NAME = "pytorch_lora_weights.safetensors"  # the file name diffusers' LoRA loaders look for


def _plain_file_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def make_readable(folder: str) -> str:
    """Give every file under ``folder`` the mode of a newly created plain file; returns ``folder``.
    Symbolic links (a pipeline export's links to the source's components) are neither followed nor
    changed: what they point at is not the export's."""
    mode = _plain_file_mode()
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, mode)
    return folder


def check_pretrained_folder(path: str, what: str, config: str = "config.json") -> str:
    """Raise a ConfigError naming ``what`` (e.g. "--vae-path '/models/vae'") unless ``path`` is a
    folder with ``config`` and ``.safetensors`` weights; returns ``path``."""
    if not os.path.isdir(path):
        raise ConfigError(f"{what} does not exist or is not a folder; give a local folder written by "
                          f"save_pretrained (with {config} and .safetensors weights).")
    names = os.listdir(path)
    if config not in names:
        raise ConfigError(f"{what} has no {config}; give a folder written by save_pretrained (a pipeline's "
                          f"component folder, e.g. its vae/ or transformer/).")
    if not any(name.endswith(".safetensors") for name in names):
        pickled = sorted(name for name in names if name.endswith(PICKLED))
        found = f"only pickled weights ({', '.join(pickled)}), which are not read because unpickling runs code" \
            if pickled else "no weights"
        raise ConfigError(f"{what} holds {found}; give a folder with .safetensors weights (convert it once with "
                          f"from_pretrained + save_pretrained(safe_serialization=True) in a trusted environment).")
    return path
