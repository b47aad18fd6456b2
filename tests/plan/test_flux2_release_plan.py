"""The planner sizes a FLUX.2 run from the released transformer config (no folder on the machine) at the
pixels per latent token FLUX.2's latents have: the VAE's 8, then its 2x2 patches stored in the channels
(``FamilyEncoders.pixels_per_latent`` = 16), so 1024-pixel images are 64 x 64 = 4096 tokens."""

import os

from opendit_lite.builders.geometry import LatentBucket, config_downsample, latent_buckets
from opendit_lite.config import load_config
from opendit_lite.config.video_schema import VideoTrainConfig

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
RELEASE = ["model.pipeline=null", "model.name=Flux2Transformer2DModel", "model.path=/path/to/FLUX.2-dev/transformer",
           "data.type=latents", "data.num_frames=1", "text_encoder.max_length=512"]


def test_a_flux2_release_plans_1024_pixel_images_as_64x64_latent_tokens(tmp_path):
    release = [*RELEASE, f"data.path={tmp_path}"]  # a latents folder without meta.json: sizes from data.image_size
    cfg = load_config(os.path.join(ROOT, "configs", "flux2_lora.yaml"), release, schema=VideoTrainConfig)
    assert config_downsample(cfg) == 16
    assert latent_buckets(cfg) == [LatentBucket("1x1024x1024", 1, 64, 64)]
    flux = load_config(os.path.join(ROOT, "configs", "flux2_lora.yaml"),
                       [*release[:1], "model.name=FluxTransformer2DModel", *release[2:]], schema=VideoTrainConfig)
    assert config_downsample(flux) == 8  # FLUX.1's latents: the VAE's 8, patched by the model
