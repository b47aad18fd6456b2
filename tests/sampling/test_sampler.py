"""One sampler path for images and videos: ``check_sampler`` and ``denoise`` (euler / ddpm / ddim),
and the image and video samplers built on them, against references written here with the
diffusion objects themselves (the samplers as each family called them before they shared one
dispatch): the same tensors, bit for bit."""

import pytest
import torch

from opendit_lite.builders.video import build_video_model
from opendit_lite.config import ConfigError, load_config
from opendit_lite.config.video_schema import VideoTrainConfig
from opendit_lite.diffusion import RectifiedFlow, cfg_model_fn, create_diffusion
from opendit_lite.diffusion.sampling_utils import SampleGenerators
from opendit_lite.models import build_model
from opendit_lite.sampling.image import sample_images
from opendit_lite.sampling.sampler import check_sampler
from opendit_lite.sampling.video import sample_clips
from tests.sampling.test_parallel_sampling import perturb

IMAGE = [("iddpm", "ddpm", True), ("iddpm", "ddim", True), ("rflow", "euler", False)]


def reference_sample(model_fn, noise, cfg, kwargs, generators, clip_denoised):
    """The sampler of ``cfg.sample.sampler`` called directly."""
    s, d = cfg.sample, cfg.diffusion
    if s.sampler == "euler":
        return RectifiedFlow(num_timesteps=d.diffusion_steps).sample(
            model_fn, noise=noise, model_kwargs=kwargs, num_steps=s.num_sampling_steps, generator=generators)
    diffusion = create_diffusion(("ddim" if s.sampler == "ddim" else "") + str(s.num_sampling_steps),
                                 noise_schedule=d.noise_schedule, learn_sigma=cfg.model.learn_sigma,
                                 diffusion_steps=d.diffusion_steps)
    loop = diffusion.ddim_sample_loop if s.sampler == "ddim" else diffusion.p_sample_loop
    return loop(model_fn, noise.shape, noise, clip_denoised=clip_denoised, model_kwargs=kwargs, device="cpu",
                generator=generators)


@pytest.mark.parametrize("objective, sampler, learn_sigma", IMAGE)
def test_image_samples_equal_the_reference(objective, sampler, learn_sigma):
    cfg = load_config("configs/demo.yaml", [f"diffusion.objective={objective}", f"sample.sampler={sampler}",
                                            f"model.learn_sigma={learn_sigma}", "model.name=DiT-T/2",
                                            "model.input_size=[8]", "model.in_channels=4", "model.num_classes=3",
                                            "sample.num_sampling_steps=3", "sample.cfg_scale=2.5"])
    model = build_model("DiT-T/2", input_size=8, in_channels=4, num_classes=3, learn_sigma=learn_sigma).eval()
    perturb(model, 0)
    labels, indices = torch.tensor([2, 0]), [5, 6]
    got = sample_images(model, cfg, labels, indices, "cpu")

    generators = SampleGenerators(cfg.sample.seed, indices)
    z = generators.standard_normal((2, 4, 8, 8), "cpu", torch.float32)
    z2, y2 = torch.cat([z, z]), torch.cat([labels, torch.full_like(labels, 3)])  # [cond; uncond]
    # IDDPM guides DiT's first 3 channels, as the reference implementation; rectified flow all of them.
    guided = cfg_model_fn(model, 2.5, channels=None if sampler == "euler" else 3)
    with torch.no_grad():
        want = reference_sample(guided, z2, cfg, dict(y=y2), generators, clip_denoised=True)[:2]
    assert torch.equal(got, want)


@pytest.mark.parametrize("objective, sampler", [("rflow", "euler"), ("iddpm", "ddim"), ("iddpm", "ddpm")])
def test_video_samples_equal_the_reference(objective, sampler):
    cfg = load_config("configs/video_stdit_demo.yaml", [
        f"diffusion.objective={objective}", f"sample.sampler={sampler}", "model.in_channels=3", "model.num_frames=2",
        "model.input_size=[8,8]", "model.caption_channels=32", "data.image_size=8", "data.num_frames=2",
        "sample.num_sampling_steps=2", "sample.num_frames=1"], schema=VideoTrainConfig)
    model = build_video_model(cfg).eval()
    perturb(model, 1)
    states, mask = torch.randn(2, cfg.text_encoder.max_length, 32), torch.ones(2, cfg.text_encoder.max_length).bool()
    indices = [0, 3]
    got = sample_clips(model, cfg, states, mask, indices, "cpu")
    assert got.shape == (2, 3, 1, 8, 8)  # sample.num_frames: an image from the video model

    generators = SampleGenerators(cfg.sample.seed, indices)
    z = generators.standard_normal((2, 3, 1, 8, 8), "cpu", torch.float32)
    with torch.no_grad():
        want = reference_sample(cfg_model_fn(model, cfg.sample.cfg_scale), z, cfg, dict(y=states, mask=mask),
                                generators, clip_denoised=True)  # pixel space
    assert torch.equal(got, want)


def test_the_sampler_must_fit_the_objective():
    for schema, config in ((None, "configs/demo.yaml"), (VideoTrainConfig, "configs/video_stdit_demo.yaml")):
        kwargs = {} if schema is None else {"schema": schema}
        with pytest.raises(ConfigError, match="'sample.sampler'='ddim' does not fit .* use sample.sampler=euler"):
            check_sampler(load_config(config, ["diffusion.objective=rflow", "sample.sampler=ddim"], **kwargs))
        with pytest.raises(ConfigError, match="use sample.sampler=ddpm or ddim"):
            check_sampler(load_config(config, ["diffusion.objective=iddpm", "sample.sampler=euler"], **kwargs))
        check_sampler(load_config(config, ["diffusion.objective=iddpm", "sample.sampler=ddim"], **kwargs))
