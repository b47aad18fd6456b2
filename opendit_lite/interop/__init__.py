"""Moving models between opendit_lite and other libraries: ``diffusers_dit`` maps our DiT to
diffusers' ``DiTTransformer2DModel`` and back (``scripts/export_diffusers.py`` writes the folders);
``diffusers_export`` writes the diffusers transformers trained here (Wan, Flux, ...) back to
folders their own class loads, or their LoRA adapters alone as their pipeline's LoRA file;
``pipeline_links`` writes a pipeline folder around freshly written transformers, linking the
untouched components; ``family_checkpoint`` exports a family run's checkpoint (imported from there:
it reads checkpoints and needs the families registered); ``comfyui_lora`` writes LoRA adapters under
a family's original checkpoint names (ComfyUI's) and reads them back, ``lora_import`` starts a run's
adapters from a LoRA file of either format (``lora.init_from``); ``pretrained_files`` gives exported files
the mode of a plain file and checks pretrained folders coming in. The names below are imported on
first use, so that the scripts check their arguments (``pretrained_files`` needs no torch) before
torch and diffusers are imported."""

import importlib

_LAZY = {
    **{name: "diffusers_dit" for name in ("diffusers_dit_config", "diffusers_to_dit_state_dict",
                                          "dit_to_diffusers_state_dict", "from_diffusers_dit",
                                          "timestep_frequency_mismatch", "to_diffusers_dit",
                                          "use_meta_timestep_frequencies")},
    **{name: "diffusers_export" for name in ("LORA_MODES", "export_family", "export_lora", "unwrap_model")},
    **{name: "pretrained_files" for name in ("LORA_WEIGHT_NAME", "check_pretrained_folder", "make_readable")},
    **{name: "comfyui_lora" for name in ("COMFYUI_WEIGHT_NAME", "LORA_FORMATS", "export_original_lora")},
    **{name: "lora_import" for name in ("check_lora_file", "load_lora_file")},
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_LAZY)
