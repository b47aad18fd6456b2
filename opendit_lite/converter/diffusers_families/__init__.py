"""Fused AdaLN for the diffusers transformers trained today: one module per family (Wan, Flux, SD3,
CogVideoX, HunyuanVideo, LTX-Video) and ``norms.py`` for diffusers' adaptive norm modules that
several of them share. Importing this package registers them with the ``fused_adaln`` conversion
(``register_adaln_block``) and registers, per model class, what is fused and what is left and why
(``register_adaln_model``), which ``parallelize`` reports. Nothing here imports diffusers: the
classes are recognised once a model built from diffusers has imported them.
"""

from . import blocks, cogvideox, flux, hunyuan_video, ltx_video, norms, sd3, wan  # noqa: F401
