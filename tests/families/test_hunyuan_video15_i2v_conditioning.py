"""HunyuanVideo 1.5 image-to-video (``HunyuanVideo15ImageToVideoPipeline``, a variant of the family): the
variant's conditioning (``conditioning_i2v.py``), called on the pipeline object with the caption and the
conditioning image as a training batch gives them ([3, H, W] in [-1, 1]), feeds the transformer every
keyword the pipeline's own call feeds it (captured by forward pre-hooks): the latents with the image's
condition latents on frame 0 and the mask channel, SigLIP's image states, the caption's and glyph
states, ``timestep_r=None``, the timestep; for the empty caption, the unconditional branch with the
same image. A MeanFlow-distilled transformer (``use_meanflow``) is refused.

Run with -s to see the largest difference of each input."""

import numpy as np
import pytest
import torch

from opendit_lite.errors import ConfigError
from opendit_lite.families import FAMILIES, conditioning_of_pipeline
from opendit_lite.families.tiny_pipelines import TINY_CALLS
from tests.families.pipeline_capture import capture
from tests.families.test_pipeline_conditioning import IGNORED, _difference

CAPTION = 'a red square with the sign "OPEN" moving left'


def test_image_to_video_conditioning_feeds_what_the_pipeline_feeds(tiny_pipeline):
    from diffusers import DiffusionPipeline
    from PIL import Image

    pipe = DiffusionPipeline.from_pretrained(tiny_pipeline("hunyuanvideo15_i2v"), local_files_only=True)
    conditioning = conditioning_of_pipeline(type(pipe).__name__)
    assert conditioning is FAMILIES["hunyuan_video15"].conditioning_of("HunyuanVideo15ImageToVideoPipeline")
    assert conditioning.image_input == "first_frame" and conditioning.max_images == 1

    pixels = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)  # a size the pipeline keeps
    image = Image.fromarray(pixels)
    frames = TINY_CALLS["hunyuanvideo15_i2v"]["num_frames"]
    latent_frames = conditioning.latent_frames(pipe, frames)
    noise = torch.randn(1, 4, latent_frames, 8, 8, generator=torch.Generator().manual_seed(1))
    calls = capture(pipe, CAPTION, noise=noise, image=image, **TINY_CALLS["hunyuanvideo15_i2v"])

    as_batch = torch.from_numpy(pixels).permute(2, 0, 1).float() / 127.5 - 1             # [3, H, W] in [-1, 1]
    with torch.no_grad():  # as the trainer encodes (PipelineEncoders)
        images = conditioning.encode_images(pipe, [[as_batch]], (frames, 32, 32))
        texts = {prompt: conditioning.encode_text(pipe, [prompt]) for prompt in (CAPTION, "")}
    assert set(images) == set(conditioning.image_keys)
    constants = conditioning.constants(pipe, pipe.transformer.config, None)
    largest = {}
    for step in sorted({c.step for c in calls.calls}):
        for prompt, ref in ((CAPTION, calls.conditional(step)), ("", calls.unconditional(step))):
            text = dict(texts[prompt], **images)
            t = ref["timestep"].reshape(-1)[:1].float()
            mine = conditioning.inputs(pipe.transformer.config, constants, ref["hidden_states"][:, :4], t, text)
            assert set(mine) == set(ref) - IGNORED, f"{sorted(mine)} vs {sorted(ref)}"
            for key in mine:
                largest[key] = max(largest.get(key, 0.0), _difference(mine[key], ref[key]))
    print("\nhunyuanvideo15_i2v: " + ", ".join(f"{k} {v:.2g}" for k, v in sorted(largest.items())))
    assert all(diff == 0 for diff in largest.values()), largest
    assert calls.conditional(0)["hidden_states"][:, 4:8, 0].abs().sum() > 0  # the image's latents really arrive

    pipe.transformer.register_to_config(use_meanflow=True)
    with pytest.raises(ConfigError, match="MeanFlow"):
        conditioning.constants(pipe, pipe.transformer.config, None)
