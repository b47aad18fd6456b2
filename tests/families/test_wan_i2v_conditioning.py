"""Wan's image-to-video conditioning (``families/wan/conditioning_i2v.py``) feeds the transformer what
``WanImageToVideoPipeline.__call__`` feeds it, for the three released layouts as tiny random pipelines:
Wan 2.1 I2V (36 channels and CLIP image states), Wan 2.2 I2V-A14B (two experts, no image encoder) and
Wan 2.2 TI2V-5B (48-channel VAE, the image latents as the first frame, per-token timesteps with zero
on that frame); and TI2V-5B's own folder (``WanPipeline`` with ``expand_timesteps``) trains text-to-video
as that pipeline calls its transformer.

For the same caption, image, noise and time, the pipeline's call is recorded with forward pre-hooks
(``pipeline_capture.capture``) at every denoising step, and the conditioning's ``encode_text`` /
``encode_images`` / ``constants`` / ``inputs`` on the same pipeline object give every keyword, in the
conditional branch and, for a dropped caption (the encoded empty prompt, the same image), in the
unconditional one; A14B's steps run the expert the conditioning's boundary names.

Run with -s to see the largest difference of each input."""

import numpy as np
import pytest
import torch

from opendit_lite.families import FAMILIES
from opendit_lite.families.tiny_pipelines import TINY_CALLS, build_tiny_pipeline
from tests.families.pipeline_capture import capture

CAPTION = "a red square moving left"
IGNORED = {"attention_kwargs", "return_dict"}


def _picture(seed: int = 0):
    """A random 8-bit RGB picture of the tiny calls' size and the same picture as the data gives it:
    [3, H, W] in [-1, 1], computed as the pipeline's image processor normalises it."""
    import PIL.Image

    call = TINY_CALLS["wan_i2v"]
    pixels = np.random.RandomState(seed).randint(0, 256, (call["height"], call["width"], 3), dtype=np.uint8)
    tensor = torch.from_numpy(pixels.astype(np.float32) / 255.0).permute(2, 0, 1) * 2.0 - 1.0
    return PIL.Image.fromarray(pixels), tensor


def _pipeline(name: str):
    """The tiny pipeline ``name``; ``wan_ti2v_i2v``: the TI2V-5B folder loaded as WanImageToVideoPipeline,
    as its image-to-video runs (``expand_timesteps`` from the folder)."""
    if name != "wan_ti2v_i2v":
        return build_tiny_pipeline(name)
    from diffusers import WanImageToVideoPipeline

    pipe = build_tiny_pipeline("wan_ti2v")
    return WanImageToVideoPipeline(**pipe.components, expand_timesteps=pipe.config.expand_timesteps)


def _noise(pipe, call) -> torch.Tensor:
    frames = (call["num_frames"] - 1) // pipe.vae_scale_factor_temporal + 1
    side = call["height"] // pipe.vae_scale_factor_spatial
    return torch.randn(1, pipe.vae.config.z_dim, frames, side, side, generator=torch.Generator().manual_seed(1))


def _difference(mine, ref) -> float:
    if ref is None:
        assert mine is None
        return 0.0
    assert torch.is_tensor(mine) and mine.shape == ref.shape, f"{getattr(mine, 'shape', mine)} vs {ref.shape}"
    return (mine.double() - ref.double()).abs().max().item()


@pytest.mark.parametrize("name", ["wan_i2v", "wan22_i2v", "wan_ti2v_i2v", "wan_ti2v"])
def test_every_transformer_input_equals_the_pipelines(name):
    pipe = _pipeline(name)
    pipeline_class = type(pipe).__name__
    conditioning = FAMILIES["wan"].conditioning_of(pipeline_class)
    call = TINY_CALLS["wan_ti2v" if name == "wan_ti2v_i2v" else name]
    picture, image = _picture()
    noise = _noise(pipe, call)
    i2v = pipeline_class == "WanImageToVideoPipeline"
    stop = None if name == "wan22_i2v" else 0  # A14B: all three steps, to run both experts
    calls = capture(pipe, CAPTION, noise=noise, stop_after_step=stop, **call, **(dict(image=picture) if i2v else {}))

    with torch.no_grad():  # as the trainer's encoders run
        text, null = conditioning.encode_text(pipe, [CAPTION]), conditioning.encode_text(pipe, [""])
        images = conditioning.encode_images(pipe, [[image]], (call["num_frames"], call["height"], call["width"]))
    config = pipe.transformer.config
    constants = conditioning.constants(pipe, config, None)
    boundary = conditioning.expert_boundary(pipe)
    channels = pipe.vae.config.z_dim
    largest = {}
    for step in sorted({c.step for c in calls.calls}):
        component = calls.at(step)[0].component
        for dropped in (False, True):
            ref = calls.unconditional(step) if dropped else calls.conditional(step)
            t = ref["timestep"].reshape(-1).max().float()[None]       # TI2V: the first frame's tokens are at 0
            assert component == ("transformer" if boundary is None or t >= boundary else "transformer_2")
            x = ref["hidden_states"][:, :channels].clone()               # the noisy latents: 16 of 36 channels
            if constants["expand_timesteps"] and i2v:
                x[:, :, 0] = noise[:, :, 0]  # the pipeline's own noise there; the given image replaces it
            with torch.no_grad():
                mine = conditioning.inputs(config, constants, x, t, dict(null if dropped else text, **images))
            assert set(mine) == set(ref) - IGNORED, f"{sorted(mine)} vs {sorted(ref)}"
            for key in mine:
                largest[key] = max(largest.get(key, 0.0), _difference(mine[key], ref[key]))
    print(f"\n{name} ({pipeline_class}): " + ", ".join(f"{k} {v:.2g}" for k, v in sorted(largest.items())))
    assert all(v == 0.0 for v in largest.values()), largest
    if name == "wan22_i2v":
        assert {c.component for c in calls.calls} == {"transformer", "transformer_2"}
    assert (config.image_dim is not None) == ("encoder_hidden_states_image" in images) == (name == "wan_i2v")

    # The loss covers what the pipeline denoises: all but TI2V image-to-video's given first frame.
    mask = conditioning.loss_mask(config, constants, noise)
    if name == "wan_ti2v_i2v":
        assert mask.shape == (1, 1, noise.shape[2], 1, 1) and mask[:, :, 0].eq(0).all() and mask[:, :, 1:].eq(1).all()
    else:
        assert mask is None


def test_without_ftfy_image_to_video_cleans_prompts_as_the_text_to_video_pipeline():
    """diffusers 0.42.1's image-to-video module calls ftfy unchecked; without ftfy it cleans as WanPipeline's."""
    from diffusers.pipelines.wan import pipeline_wan, pipeline_wan_i2v
    from diffusers.utils import is_ftfy_available

    from opendit_lite.families.wan.conditioning_i2v import clean_prompts_without_ftfy

    clean_prompts_without_ftfy()
    text = "  a red &amp;amp; blue\n square  "
    assert pipeline_wan_i2v.prompt_clean(text) == pipeline_wan.prompt_clean(text) == "a red & blue square"
    assert (pipeline_wan_i2v.basic_clean is pipeline_wan.basic_clean) == (not is_ftfy_available())
