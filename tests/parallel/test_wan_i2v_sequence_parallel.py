"""Sequence parallelism of Wan's image-to-video transformers at 2 ranks equals one process, fp32, on the
inputs ``families/wan/conditioning_i2v.py`` builds: Wan 2.1 I2V (36 channels: the condition latents and
mask channels enter the patch embedding with the noisy latents, so they split with the tokens; CLIP
image states reach every rank's cross-attention whole), Wan 2.1 FLF2V (both images' CLIP states, a row
each, with the transformer's position embedding over the pair) and Wan 2.2 TI2V-5B (the given first frame
in place, per-token timesteps split with the tokens; and its text-to-video, ``WanPipeline``'s conditioning
with ``expand_timesteps``: the same timestep on every token, split with them). Ulysses, ring and USP (each
layout) at 15 tokens (uneven at sp 2); the gathered output, every parameter's world-mean
gradient and the parameters after one SGD step are compared as in
``test_diffusers_families.py`` (relative, 1e-4)."""

import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tests.parallel import tiny_families as fam
from tests.parallel.spawn import rank_checks
from tests.parallel.spawn import results as spawn_results
from tests.parallel.test_diffusers_families import TOL, _errors, _target

# Wan 2.1 I2V at test size: 16 noisy + 20 condition channels, CLIP states 16 wide (17 tokens).
I2V = dict(fam.WAN, in_channels=36, out_channels=16, image_dim=16, added_kv_proj_dim=24)
FLF2V = dict(I2V, pos_embed_seq_len=34)  # two images' 17 CLIP tokens
TI2V = dict(fam.WAN, in_channels=8, out_channels=8)
CONFIGS = {"i2v": I2V, "flf2v": FLF2V, "ti2v": TI2V, "ti2v t2v": TI2V}
GRID = (1, 6, 10)  # 15 tokens of 2x2 patches
# (layout, mode): every layout in each of Wan's modes (ring and USP split the tokens as Ulysses does, but
# attend blockwise: the per-token timesteps and the image tokens must follow their own tokens there too)
CASES = [(layout, mode) for layout in ("i2v", "flf2v", "ti2v", "ti2v t2v") for mode in ("ulysses", "ring", "usp")]


def _build(config: dict):
    import diffusers

    torch.manual_seed(0)
    return diffusers.WanTransformer3DModel(**config).float().train()


def _inputs(layout: str, seed: int) -> dict:
    """The transformer's keywords as the layout's conditioning gives them (random latents, image
    states, text)."""
    from opendit_lite.families import FAMILIES

    g = torch.Generator().manual_seed(seed)
    config = CONFIGS[layout]
    pipeline = "WanPipeline" if layout == "ti2v t2v" else "WanImageToVideoPipeline"
    conditioning = FAMILIES["wan"].conditioning_of(pipeline).for_model(config)
    channels = config["out_channels"]
    x = torch.randn(2, channels, *GRID, generator=g)
    t = torch.rand(2, generator=g) * 1000
    text = {"encoder_hidden_states": torch.randn(2, 12, config["text_dim"], generator=g)}
    if layout in ("i2v", "flf2v"):
        images = (2,) if layout == "flf2v" else ()  # FLF2V: each sample's first and last image
        text.update(condition=torch.randn(2, 20, *GRID, generator=g),
                    encoder_hidden_states_image=torch.randn(2, *images, 17, 16, generator=g))
    elif layout == "ti2v":
        text.update(condition=torch.randn(2, channels, 1, *GRID[1:], generator=g))
    constants = {"expand_timesteps": layout.startswith("ti2v")}
    return dict(conditioning.inputs(config, constants, x, t, text), return_dict=False)


def _compare(layout: str, mode: str = "ulysses", lr: float = 10.0) -> dict:
    """One forward, backward and SGD step of one batch: ``mode`` over both ranks vs serial (as
    ``test_diffusers_families.compare``: the ranks' gradients summed, over the world size)."""
    from opendit_lite.parallelization import parallelize

    config = CONFIGS[layout]
    serial = _build(config)
    before = {n: p.detach().clone() for n, p in serial.named_parameters()}
    ref_out = serial(**_inputs(layout, 10))[0]
    F.mse_loss(ref_out, _target(ref_out, 0)).backward()
    ref_grads = {n: p.grad.clone() for n, p in serial.named_parameters() if p.grad is not None}
    torch.optim.SGD(serial.parameters(), lr=lr).step()

    model = _build(config)
    parallelize(model, sp_group=dist.group.WORLD, sp_mode=mode)
    out = model(**_inputs(layout, 10))[0]
    F.mse_loss(out, _target(out, 0)).backward()
    grads = {}
    for n, p in model.named_parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            grads[n] = p.grad.div_(dist.get_world_size())
    torch.optim.SGD(model.parameters(), lr=lr).step()
    return _errors(out.detach(), ref_out.detach(), grads, ref_grads, dict(model.named_parameters()),
                   dict(serial.named_parameters()), before)


@rank_checks("wan image-to-video", world_size=2)
def _world2(rank, world_size):
    warnings.filterwarnings("ignore")
    return {f"{layout}{'' if mode == 'ulysses' else ' ' + mode}": _compare(layout, mode) for layout, mode in CASES}


def test_image_to_video_at_sp2_equals_one_process():
    per_rank = spawn_results("wan image-to-video", 2)
    for layout in (f"{layout}{'' if mode == 'ulysses' else ' ' + mode}" for layout, mode in CASES):
        worst = {k: max(r[layout][k] for r in per_rank) for k in ("out", "grad", "step")}
        print(f"\n{layout}: " + ", ".join(f"{k} {v:.2g}" for k, v in worst.items()))
        assert per_rank[0][layout]["missing"] == [], per_rank[0][layout]["missing"]
        for what, value in worst.items():
            assert value < TOL, f"{layout}: {what} differs by {value:.2e} (relative)"


def _sample_i2v(sp_group=None):
    """WanImageToVideoPipeline's clip for one prompt and image (noise from a fixed generator), its
    transformer sequence-parallel over ``sp_group`` when given: [1, 3, T, H, W]."""
    import numpy as np
    from PIL import Image

    from opendit_lite.families.tiny_pipelines import TINY_CALLS, build_tiny_pipeline
    from opendit_lite.parallelization import parallelize
    from opendit_lite.sampling.pipeline_sampling import pipeline_pixels

    pipe, call = build_tiny_pipeline("wan_i2v"), dict(TINY_CALLS["wan_i2v"], num_inference_steps=2)
    if sp_group is not None:
        report = parallelize(pipe.transformer, sp_group=sp_group, sp_mode="ulysses")
        assert "ulysses" in str(report), report
    picture = np.random.default_rng(0).integers(0, 255, (call["height"], call["width"], 3), dtype=np.uint8)
    with torch.no_grad():
        out = pipe(image=Image.fromarray(picture), prompt="a red square moving left", output_type="pt",
                   generator=torch.Generator().manual_seed(3), **call)
    return pipeline_pixels(out).float()


@rank_checks("wan image-to-video sampling", world_size=2)
def _sampling_world2(rank, world_size):
    warnings.filterwarnings("ignore")
    return _sample_i2v(dist.group.WORLD)


def test_image_to_video_sampling_at_sp2_equals_one_process():
    """Sampling an image-conditioned pipeline with its transformer's tokens split over 2 ranks (what
    sample_video.py does at sp_size=2) gives the one-process clip on every rank."""
    serial = _sample_i2v()
    for clip in spawn_results("wan image-to-video sampling", 2):
        assert (clip - serial).abs().max() <= 1e-5, (clip - serial).abs().max()
