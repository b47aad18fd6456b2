"""The LoRA student of a pipeline's distillation (``training/distill_pipeline.py``) out of its checkpoints:
the ``student`` adapter of the module's base (``base.*``, ``builders/distill_model.py``'s LoRA layout),
renamed to peft's default adapter and written as the fine-tune LoRA export writes a LoRA run's adapters
(the family pipeline's ``save_lora_weights`` format, and/or ComfyUI's original names), which the
pipeline's ``load_lora_weights`` loads. train_video.py's export and sample_video.py both use it.
"""

from typing import Dict, Optional

import torch

from ..checkpoint.weights import read_weights
from ..errors import CheckpointError
from ..interop.diffusers_export import ADAPTER
from .distill_model import STUDENT, student_state


def is_pipeline_distillation(saved: dict) -> bool:
    """Whether a checkpoint's saved config is a pipeline's distillation (``model.pipeline`` and ``distill.teacher``)."""
    return bool((saved.get("distill") or {}).get("teacher") and (saved.get("model") or {}).get("pipeline"))


def student_guidance(cfg) -> float:
    """The ``guidance_scale`` the pipeline samples a distilled student at: its off value (no classifier-free
    guidance), or for a guidance-embedded transformer (FLUX.1-dev) the value the student was trained with
    in its embedding (``model.guidance``, else the pipeline's default)."""
    from ..families.conditioning_base import call_default
    from .pipeline import light_pipeline, run_pipeline_folder

    folder = run_pipeline_folder(cfg)
    c = folder.conditioning
    if not c.guided(folder.transformer_config()):
        return c.unguided_scale
    if cfg.model.guidance is not None:
        return cfg.model.guidance
    return call_default(light_pipeline(folder.path, folder.pipeline_class), "guidance_scale")


def student_lora_state(checkpoint: str, rank: int, use_ema: bool) -> Dict[str, torch.Tensor]:
    """The student of a distillation checkpoint as the transformer's state: a LoRA run's (``rank`` > 0)
    base weights with the student's adapter under peft's default name (the critic's left out); a
    full-weight run's student transformer."""
    try:
        state = read_weights(checkpoint, use_ema=use_ema)
    except (FileNotFoundError, ValueError) as e:
        raise CheckpointError(f"cannot read the weights of {checkpoint!r}: {e}") from None
    return {k.replace(f".{STUDENT}.", f".{ADAPTER}."): v for k, v in student_state(state, {"rank": rank}).items()}


def write_student_pipeline(model: dict, checkpoint: str, out: str, *, use_ema: bool) -> str:
    """Write a full-weight student of ``checkpoint`` as a pipeline folder ``out`` (existing): its
    transformer written fresh, the other components of the run's ``model.pipeline`` linked, as the
    fine-tune export writes a fully trained pipeline; returns ``out``."""
    import os

    from ..interop.diffusers_export import export_family
    from ..interop.family_checkpoint import family_model_skeleton
    from ..interop.pipeline_links import link_pipeline

    link_pipeline(model["pipeline"], out, trained=["transformer"])
    export_family(family_model_skeleton(model), os.path.join(out, "transformer"),
                  state=student_lora_state(checkpoint, 0, use_ema=use_ema), lora="merged")
    return out


def write_student_adapter(model: dict, lora: dict, checkpoint: str, out: str, *, use_ema: bool,
                          lora_format: str = "diffusers", state: Optional[Dict[str, torch.Tensor]] = None) -> str:
    """Write the student adapter of ``checkpoint`` (a run whose saved sections are ``model`` and ``lora``)
    into the existing folder ``out`` in ``lora_format`` ("diffusers", "comfyui" or "both"), in this
    process; returns ``out``."""
    from ..interop.comfyui_lora import export_original_lora
    from ..interop.diffusers_export import export_lora
    from ..interop.family_checkpoint import family_model_skeleton

    if state is None:
        state = student_lora_state(checkpoint, lora["rank"], use_ema=use_ema)
    skeleton = family_model_skeleton(model, lora)
    if lora_format in ("diffusers", "both"):
        export_lora(skeleton, out, state=state)
    if lora_format in ("comfyui", "both"):
        export_original_lora(skeleton, out, state=state)
    return out
