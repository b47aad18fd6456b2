"""Pre-flight checks of a training run, before any model is built or any step taken: every mistake
found here costs the user seconds, not a run.

    check_training_inputs(cfg, family="image")   # train.py; "video" for train_video.py
    ...build the model...
    check_disk_space(checkpoint_root(cfg), num_params)

Each failed check raises a ConfigError (one paragraph, exit code 2) naming the setting, what is
wrong and what to do.
"""

import os
import shutil
import sys
import uuid

from ..builders.family import check_model_family
from ..checkpoint.catalog import META_FILE, list_checkpoints
from ..checkpoint.layout import check_saved_model, checkpoint_root, wants_resume
from ..checkpoint.weights import weight_files, weights_folder
from ..config import ConfigError
from ..errors import CheckpointError

# Bytes per parameter in one checkpoint, an upper bound: fp32 weights, fp32 EMA, fp32 master
# shards and AdamW's two fp32 moments (bf16 working weights make it smaller).
CHECKPOINT_BYTES_PER_PARAM = 4 * 5


def check_training_inputs(cfg, family: str) -> None:
    """The checks that need only the config and the file system (run them on every rank)."""
    check_model_family(cfg.model.name, family)
    check_writable(cfg.results_dir, "results_dir")
    check_writable(checkpoint_root(cfg), "checkpoint_dir" if cfg.checkpoint_dir else "results_dir")
    if cfg.resume_from:
        check_checkpoint_of_model(cfg.resume_from, "resume_from", cfg.model.name)
    if cfg.init_from:
        check_checkpoint_of_model(cfg.init_from, "init_from", cfg.model.name)
    if cfg.lora.init_from:
        check_lora_init(cfg)
    check_fresh_run(cfg)
    check_data_path(cfg.data.type, cfg.data.path)


def check_lora_init(cfg) -> None:
    """``lora.init_from`` can start this run's adapters: a LoRA run of one diffusers family
    transformer, and a LoRA file of a format it reads (``interop.lora_import``)."""
    from ..interop.lora_import import check_lora_file

    if not cfg.lora.rank:
        raise ConfigError(f"lora.init_from {cfg.lora.init_from!r} starts a LoRA run's adapters, but this run trains "
                          f"every weight (lora.rank=0): set lora.rank to the file's rank, or use init_from for "
                          f"whole-model weights.")
    if getattr(cfg.model, "expert", None) == "both":
        raise ConfigError("lora.init_from starts one transformer's adapters, and this run trains Wan 2.2's two "
                          "experts (model.expert: both), which it does not support yet: train one expert "
                          "(model.expert: high_noise or low_noise) from the file, or remove lora.init_from.")
    check_lora_file(cfg.lora.init_from, cfg.model.name)


def check_writable(folder: str, key: str) -> None:
    """Create ``folder`` if needed and write (then delete) a probe file in it."""
    probe = os.path.join(folder, f".write-probe-{uuid.uuid4().hex[:8]}")
    try:
        os.makedirs(folder, exist_ok=True)
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise ConfigError(f"Cannot write to {folder!r} (from '{key}'): {e.strerror or e}. Choose a folder this "
                          f"user can write to, or fix its permissions.") from None


def check_checkpoint_of_model(path: str, key: str, model_name: str) -> None:
    """``path`` exists; when it is a checkpoint folder of ours, it holds ``model_name``."""
    if not os.path.exists(path):
        raise ConfigError(f"'{key}' {path!r} does not exist. Point it at a checkpoint folder "
                          f"(<results_dir>/<exp_name>/checkpoints/<exp_name>_step<N>), or use auto_resume=true.")
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, META_FILE)):
        if key == "resume_from":
            raise ConfigError(f"'{key}' {path!r} is not a complete checkpoint folder (it has no {META_FILE}: its save "
                              f"was interrupted, or it is another kind of folder). Pick a <exp_name>_step<N> folder "
                              f"written by training, or use auto_resume=true to take the newest complete one.")
        try:  # init_from may be a sharded weight folder: it must hold weights
            found = weight_files(weights_folder(path))
        except (OSError, ValueError, KeyError) as e:
            raise ConfigError(f"'{key}' {path!r}: its weight index cannot be read ({e}).") from None
        if not found:
            raise ConfigError(f"'{key}' {path!r} is a folder without .safetensors weights (in it or in its model/): "
                              f"point it at a checkpoint folder, a sharded weight folder, a .safetensors file or an "
                              f"original DiT .pt.")
        return
    if not os.path.isdir(path):
        return  # init_from: a weight file (.pt/.safetensors); load_weights checks it
    try:
        check_saved_model(path, key, model_name)
    except CheckpointError as e:
        raise ConfigError(f"'{key}' {path!r}: {e}; the checkpoint is damaged.") from None


def check_fresh_run(cfg) -> None:
    """A run that resumes nothing must not write into a folder holding checkpoints of ``exp_name``
    (it would replace same-named steps), unless ``overwrite=true``."""
    if cfg.overwrite or wants_resume(cfg):
        return
    root = checkpoint_root(cfg)
    found = list_checkpoints(root, cfg.exp_name)
    if found:
        raise ConfigError(f"{root!r} already holds {len(found)} checkpoint(s) of experiment '{cfg.exp_name}' (newest: "
                          f"step {found[-1][0]}) and this run resumes none of them: resume with auto_resume=true, "
                          f"or choose another exp_name / results_dir (overwrite=true replaces them).")


def check_data_path(kind: str, path) -> None:
    """``path`` (when the data type reads one) is readable and not empty (a folder dataset's list of
    entries is checked when it is read, ``data.media_folders``)."""
    if not path or not isinstance(path, str) or "://" in path:  # an object store: read when the data opens
        return
    if not os.access(path, os.R_OK):
        raise ConfigError(f"'data.path' {path!r} is not readable by this user.")
    if os.path.isdir(path):
        if not any(not name.startswith(".") for name in os.listdir(path)):
            raise ConfigError(f"'data.path' {path!r} is an empty folder (data.type={kind}). Point it at the data.")
    elif os.path.getsize(path) == 0:
        raise ConfigError(f"'data.path' {path!r} is an empty file (data.type={kind}). Point it at the data.")


def check_disk_space(folder: str, num_params: int) -> None:
    """Stop when the checkpoint folder lacks room for one checkpoint; warn below two."""
    need = num_params * CHECKPOINT_BYTES_PER_PARAM
    free = shutil.disk_usage(folder).free
    gib = 1 << 30
    if free < need:
        raise ConfigError(f"{folder!r} has {free / gib:.2f} GiB free, less than one checkpoint of this model "
                          f"(about {need / gib:.2f} GiB for {num_params / 1e6:.1f}M parameters). Free space or "
                          f"set checkpoint_dir to a larger disk.")
    if free < 2 * need:
        print(f"warning: {folder!r} has {free / gib:.2f} GiB free, room for fewer than two checkpoints of about "
              f"{need / gib:.2f} GiB each; a later save may fail (keep_last=1 still needs room for two while "
              f"saving).", file=sys.stderr)
