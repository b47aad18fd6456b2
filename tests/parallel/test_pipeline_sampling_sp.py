"""Sampling through the pipelines of issues 38 and 39 with their transformer(s) Ulysses-parallel over 2 gloo
ranks (what sample.py / sample_video.py do at ``sp_size=2``: ``parallelize`` on each of the pipeline's
transformers, then the pipeline's own ``__call__``) gives the one-process sample on every rank, fp32, 1e-5:
FLUX.1 Kontext, Wan 2.2 TI2V-5B (text-to-video as its folder is, image-to-video as
``WanImageToVideoPipeline``), Wan 2.1 FLF2V, Wan 2.2 I2V-A14B (both experts), Qwen-Image, Z-Image (base and
Turbo), FLUX.2 and HunyuanVideo 1.5 (T2V and I2V). Wan 2.1 T2V and I2V and Qwen-Image-Edit (Plus) have their
own sampling checks (tests/video_scripts/test_pipeline_sampling.py, test_wan_i2v_sequence_parallel.py,
test_qwen_image_edit_sp.py).

The tiny pipelines of ``TINY_CALLS`` at their 32 x 32 sizes, one step (Qwen-Image two: its scheduler's
terminal stretch divides by zero at one step, in one process too; Wan 2.2 A14B three, so that both experts
run); an image-conditioned pipeline gets its conditioning's images (``call_images``: one, FLF2V two), Kontext's
preferred-resolution table shrunk to test size as its conditioning tests do. The checks run in the shared
2-rank spawn (``spawn.py``). Run with -s to see the differences."""

import warnings
from unittest import mock

import numpy as np
import torch
import torch.distributed as dist

from tests.parallel.spawn import rank_checks
from tests.parallel.spawn import results as spawn_results

PIPELINES = {"flux_kontext": 1, "wan_ti2v": 1, "wan_ti2v_i2v": 1, "wan_flf2v": 1, "wan22_i2v": 3, "qwenimage": 2,
             "z_image": 1, "z_image_turbo": 1, "flux2": 1, "hunyuanvideo15": 1, "hunyuanvideo15_i2v": 1}  # steps
IMAGES = {"none": 0, "first_frame": 1, "first_last_frames": 2, "reference": 1}  # images a prompt gives, by input
SMALL_RESOLUTIONS = [(24, 40), (30, 30), (42, 22)]  # Kontext's (width, height) table at test size


def sample(name: str, sp_group=None) -> torch.Tensor:
    """The tiny pipeline ``name``'s clip for one prompt (and its images), noise from a fixed generator, its
    transformers Ulysses-parallel over ``sp_group`` when given: [1, 3, T, H, W] in [-1, 1]."""
    from diffusers.pipelines.flux import pipeline_flux_kontext
    from PIL import Image

    from opendit_lite.encoders.pipeline_folder import TRANSFORMERS
    from opendit_lite.families.registry import conditioning_of_pipeline
    from opendit_lite.families.tiny_pipelines import TINY_CALLS, build_tiny_pipeline
    from opendit_lite.parallelization import parallelize
    from opendit_lite.sampling.pipeline_sampling import pipeline_pixels

    pipe = build_tiny_pipeline(name)
    conditioning = conditioning_of_pipeline(type(pipe).__name__).for_model(pipe.transformer.config)
    call = dict(TINY_CALLS[name], num_inference_steps=PIPELINES[name])
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8))
              for _ in range(IMAGES[conditioning.image_input])]
    if images:
        call.update(conditioning.call_images(images))
    if sp_group is not None:
        for component in TRANSFORMERS:
            if getattr(pipe, component, None) is not None:
                report = str(parallelize(getattr(pipe, component), sp_group=sp_group, sp_mode="ulysses"))
                assert "ulysses over 2 ranks" in report, f"{name}.{component}: {report}"
    with mock.patch.object(pipeline_flux_kontext, "PREFERRED_KONTEXT_RESOLUTIONS", SMALL_RESOLUTIONS), \
            torch.no_grad():
        out = pipe(prompt="a red square moving left", output_type="pt", generator=torch.Generator().manual_seed(3),
                   **call)
    return pipeline_pixels(out).float()


@rank_checks("pipeline sampling", world_size=2)
def _world2(rank, world_size):
    warnings.filterwarnings("ignore")
    return {name: sample(name, dist.group.WORLD) for name in PIPELINES}


def test_each_pipeline_sampled_at_sp2_equals_one_process():
    per_rank = spawn_results("pipeline sampling", 2)
    differences = {}
    for name in PIPELINES:
        serial = sample(name)
        assert torch.isfinite(serial).all(), name
        differences[name] = max((results[name] - serial).abs().max().item() for results in per_rank)
    print("\nsampled at sp 2 vs one process: " + ", ".join(f"{n} {d:.2g}" for n, d in differences.items()))
    for name, difference in differences.items():
        assert difference <= 1e-5, f"{name}: {difference:.2e}"
