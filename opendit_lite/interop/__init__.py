"""Moving models between opendit_lite and other libraries: ``diffusers_dit`` maps our DiT to
diffusers' ``DiTTransformer2DModel`` and back (``scripts/export_diffusers.py`` writes the folders);
``diffusers_export`` writes the diffusers transformers trained here (Wan, Flux, ...) back to
folders their own class loads, or their LoRA adapters alone as their pipeline's LoRA file;
``pipeline_links`` writes a pipeline folder around freshly written transformers, linking the
untouched components; ``family_checkpoint`` exports a family run's checkpoint (imported from there:
it reads checkpoints and needs the families registered); ``pretrained_files`` gives exported files
the mode of a plain file and checks pretrained folders coming in."""

from .diffusers_dit import (
    diffusers_dit_config,
    diffusers_to_dit_state_dict,
    dit_to_diffusers_state_dict,
    from_diffusers_dit,
    timestep_frequency_mismatch,
    to_diffusers_dit,
    use_meta_timestep_frequencies,
)
from .diffusers_export import LORA_MODES, LORA_WEIGHT_NAME, export_family, export_lora, unwrap_model
from .pretrained_files import check_pretrained_folder, make_readable

__all__ = [
    "LORA_MODES",
    "LORA_WEIGHT_NAME",
    "export_family",
    "export_lora",
    "make_readable",
    "unwrap_model",
    "check_pretrained_folder",
    "diffusers_dit_config",
    "diffusers_to_dit_state_dict",
    "dit_to_diffusers_state_dict",
    "from_diffusers_dit",
    "timestep_frequency_mismatch",
    "to_diffusers_dit",
    "use_meta_timestep_frequencies",
]
