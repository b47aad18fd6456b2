"""Tiny denoisers sampled with ``sample.cfg_parallel`` and ``sample.cache`` settings, the same way in
the test process (one process) and on gloo ranks: DiT-T/2 (images, the doubled-batch guidance),
STDiT-tiny and Vchitect-tiny (videos, guidance pairing the null caption inside), and the six
diffusers families at the sizes of tests/diffusers_families.py (Wan from its demo config), with
random weights (every zero-initialised layer perturbed) and a few Euler steps."""

import contextlib
import functools
import os
import tempfile

import torch
import yaml

from opendit_lite.builders.diffusers_model import family_denoiser, is_family
from opendit_lite.builders.parallelize import parallelize_from_config
from opendit_lite.builders.video import build_video_model
from opendit_lite.config import load_config
from opendit_lite.config.video_schema import VideoTrainConfig
from opendit_lite.models import build_model
from opendit_lite.sampling.fast import fast_sampling
from opendit_lite.sampling.image import sample_images
from opendit_lite.sampling.sharding import SamplingRanks, _single_process, sampling_ranks
from opendit_lite.sampling.video import sample_clips
from tests import diffusers_families

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 6

VIDEO = ["model.in_channels=3", "model.num_frames=2", "model.input_size=[8,8]", "model.caption_channels=32",
         "data.image_size=8", "data.num_frames=2", f"sample.num_sampling_steps={STEPS}", "sample.cfg_scale=3"]
CASES = {
    "dit": ("configs/demo.yaml", ["model.name=DiT-T/2", "model.num_classes=3", "model.learn_sigma=false",
                                  "model.input_size=[8]", "model.in_channels=3", f"sample.num_sampling_steps={STEPS}",
                                  "sample.cfg_scale=3"]),
    "stdit": ("configs/video_stdit_demo.yaml", VIDEO),
    "vchitect": ("configs/video_stdit_demo.yaml", ["model.name=Vchitect-tiny"] + VIDEO),
    "wan": ("configs/wan_tiny_demo.yaml", [o for o in VIDEO if "caption_channels" not in o]),
}
# family case -> (diffusers class, changes to tests/diffusers_families.py's config for 3-channel pixel clips,
# frames). Flux and HunyuanVideo there are guidance-distilled (guidance_embeds); SD3 and CogVideoX are not.
FAMILIES = {
    "flux": ("FluxTransformer2DModel", dict(in_channels=12), 1),
    "sd3": ("SD3Transformer2DModel", dict(in_channels=3, out_channels=3), 1),
    "cogvideox": ("CogVideoXTransformer3DModel", dict(in_channels=3, out_channels=3), 2),
    "hunyuan_video": ("HunyuanVideoTransformer3DModel", dict(in_channels=3, out_channels=3), 2),
    "ltx_video": ("LTXVideoTransformer3DModel", dict(in_channels=3, out_channels=3), 2),
    "flux2": ("Flux2Transformer2DModel", dict(in_channels=3), 1),
}


@functools.lru_cache(maxsize=None)
def family_yaml(case: str) -> str:
    """A config file (in this process's temporary folder) of the tiny model of family ``case``."""
    name, changes, frames = FAMILIES[case]
    config = {k: list(v) if isinstance(v, tuple) else v
              for k, v in dict(diffusers_families.CONFIGS[name], **changes).items()}
    tree = {"precision": "fp32", "model": {"name": name, "config": config, "in_channels": 3,
                                                   "num_frames": frames, "input_size": [8, 8]},
            "data": {"type": "shapes", "num_frames": frames, "image_size": 8},
            "text_encoder": {"kind": "shapes", "max_length": 8},
            "sample": {"sampler": "euler", "num_sampling_steps": STEPS, "cfg_scale": 3.0}}
    path = os.path.join(tempfile.mkdtemp(prefix="fast_models_"), f"{case}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(tree, f)
    return path


def perturb(model: torch.nn.Module, seed: int, scale: float = 0.03) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * scale)


def case_config(case: str, overrides=()):
    if case in FAMILIES:
        return load_config(family_yaml(case), list(overrides), schema=VideoTrainConfig)
    path, base = CASES[case]
    schema = None if case == "dit" else VideoTrainConfig
    kwargs = {} if schema is None else {"schema": schema}
    return load_config(os.path.join(ROOT, path), base + list(overrides), **kwargs)


def sample(case: str, overrides=(), ranks: SamplingRanks = None, hook=None):
    """(samples [2, ...] in model space, the step cache's records of the one trajectory or None) of the
    tiny ``case`` model under ``overrides`` on ``ranks`` (None: one process). ``hook(model)``, when
    given, is called on the parallelized model before sampling and may return a context manager that
    the sampling runs in (a test's reference hooks)."""
    ranks = ranks or _single_process()
    cfg = case_config(case, overrides)
    if case == "dit":
        model = build_model("DiT-T/2", input_size=8, in_channels=3, num_classes=3, learn_sigma=False)
    else:
        model = build_video_model(cfg)
    perturb(model, 7)
    parallelize_from_config(model, cfg, ranks.sp_group if ranks.sp_size > 1 else None, sampling=True)
    model.eval()
    denoiser = family_denoiser(cfg, model) if is_family(model) else model
    fast = fast_sampling(denoiser, cfg, ranks)
    context = hook(model) if hook is not None else None
    with torch.no_grad(), context or contextlib.nullcontext():
        if case == "dit":
            out = sample_images(denoiser, cfg, torch.tensor([2, 0]), [0, 1], "cpu", fast=fast)
        else:
            gen = torch.Generator().manual_seed(3)
            width = denoiser.text_width if is_family(model) else 32
            states = torch.randn(2, cfg.text_encoder.max_length, width, generator=gen)   # [n, M, Cy]
            mask = torch.ones(2, cfg.text_encoder.max_length, dtype=torch.bool)
            mask[1, 5:] = False
            out = sample_clips(denoiser, cfg, states, mask, [0, 1], "cpu", fast=fast)
    records = None if fast.cache is None else [(s.blocks, s.attention) for s in fast.cache.steps]
    return out, records


def sample_on_ranks(case: str, overrides=()):
    """``sample`` on the mesh of this launch for the config's sp_size and sample.cfg_parallel."""
    cfg = case_config(case, overrides)
    with sampling_ranks(cfg.sp_size, cfg.sample.cfg_parallel) as ranks:
        return sample(case, overrides, ranks)
