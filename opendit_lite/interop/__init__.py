"""Moving models between opendit_lite and other libraries: ``diffusers_dit`` maps our DiT to
diffusers' ``DiTTransformer2DModel`` and back (``scripts/export_diffusers.py`` writes the folders)."""

from .diffusers_dit import (
    diffusers_dit_config,
    diffusers_to_dit_state_dict,
    dit_to_diffusers_state_dict,
    from_diffusers_dit,
    timestep_frequency_mismatch,
    to_diffusers_dit,
    use_meta_timestep_frequencies,
)

__all__ = [
    "diffusers_dit_config",
    "diffusers_to_dit_state_dict",
    "dit_to_diffusers_state_dict",
    "from_diffusers_dit",
    "timestep_frequency_mismatch",
    "to_diffusers_dit",
    "use_meta_timestep_frequencies",
]
