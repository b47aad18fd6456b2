"""Sequence parallelism of Qwen-Image-Edit's inputs (a variant of the qwen_image family: the same transformer
and sequence-parallel spec), as ``families/qwen_image/conditioning_edit.py`` builds them: the reference's
packed tokens after the target's on the sequence axis and both patch grids in ``img_shapes``, so the spec's
split of ``hidden_states`` and of the image rotary table splits the reference with the target; 15 target
tokens (3 x 5 patches) and 6 reference tokens (2 x 3) make 21, uneven at sp 2; a masked caption (sample 0
masks 3 of 9 tokens). The loss is taken on ``prediction`` (the target's tokens, unpacked), as training does.

* LoRA (the family's targets, rank 4, the B matrices drawn non-zero so every adapter has a gradient):
  Ulysses, ring and USP (ring 2 x Ulysses 1, ring 1 x Ulysses 2) over 2 gloo ranks against one process,
  the gathered output and every LoRA gradient (world mean), relative, as ``test_diffusers_families.py``.
* The whole model at Ulysses: the output, every gradient and the parameters after one SGD step.
* Sampling: ``QwenImageEditPipeline`` called for one prompt and reference (``QwenImageEditPlusPipeline``: two
  references; two steps, true CFG) with its transformer Ulysses-parallel over the 2 ranks gives the one-process
  image (fp32, 1e-5) on every rank.
"""

import warnings

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from tests.parallel import tiny_families as fam
from tests.parallel.spawn import rank_checks
from tests.parallel.spawn import results as spawn_results
from tests.parallel.test_diffusers_families import TOL, _errors, _target

GRID, REFERENCE_GRID = (6, 10), (2, 3)  # latent rows x columns: 3 x 5 and 2 x 3 patches of 2 x 2
MODES = {"ulysses": ("ulysses", None), "ring": ("ring", None), "usp ring 2": ("usp", 2), "usp ring 1": ("usp", 1)}
CAPTION = "a red square moving left"
REFERENCES = {"qwenimage_edit": 1, "qwenimage_edit_plus": 2}     # sampled with this many reference images


def _inputs(model, seed: int = 10) -> dict:
    """The transformer's keywords as the edit conditioning gives them (random latents, reference, text)."""
    from opendit_lite.families import FAMILIES

    conditioning = FAMILIES["qwen_image"].conditioning_of("QwenImageEditPipeline")
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    x = torch.randn(2, cfg.out_channels, 1, *GRID, generator=g)                       # [B, C, 1, h, w]
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, 6:] = 0
    rows, columns = REFERENCE_GRID
    text = {"encoder_hidden_states": torch.randn(2, 9, cfg.joint_attention_dim, generator=g),
            "encoder_hidden_states_mask": mask,
            "reference_latents": torch.randn(2, rows * columns, cfg.in_channels, generator=g),   # [B, 6, 4C]
            "reference_grid": torch.tensor([[REFERENCE_GRID]] * 2)}                             # [B, 1, 2]
    constants = {"vae_scale_factor": 8}
    inputs = conditioning.inputs(cfg, constants, x, torch.rand(2, generator=g) * 1000, text)
    assert inputs["hidden_states"].shape[1] == 15 + 6 and inputs["img_shapes"][0] == [(1, 3, 5), (1, 2, 3)]

    def prediction(out):                                                               # the target's tokens
        return conditioning.prediction(out, x, cfg, constants)                         # [B, C, 1, h, w]

    return dict(inputs, return_dict=False), prediction


def _build(lora: bool):
    from opendit_lite.families import FAMILIES
    from opendit_lite.models.lora import apply_lora

    model = fam.build("qwen_image")
    if lora:
        apply_lora(model, rank=4, alpha=4, dropout=0.0, targets=FAMILIES["qwen_image"].lora_targets)
        g = torch.Generator().manual_seed(7)
        with torch.no_grad():  # B is zero as peft starts it: A's gradients would be zero on both sides
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model


def _step(model, lr: float):
    inputs, prediction = _inputs(model)
    out = prediction(model(**inputs)[0])
    F.mse_loss(out, _target(out, 0)).backward()
    return out.detach()


def _compare(mode: str, ring_size, lora: bool, lr: float = 10.0) -> dict:
    """One forward, backward and SGD step of one batch over both ranks vs one process."""
    from opendit_lite.parallelization import parallelize

    serial = _build(lora)
    before = {n: p.detach().clone() for n, p in serial.named_parameters()}
    ref_out = _step(serial, lr)
    ref_grads = {n: p.grad.clone() for n, p in serial.named_parameters() if p.grad is not None}
    torch.optim.SGD([p for p in serial.parameters() if p.requires_grad], lr=lr).step()

    model = _build(lora)
    report = parallelize(model, sp_group=dist.group.WORLD, sp_mode=mode, sp_ring_size=ring_size)
    out = _step(model, lr)
    grads = {}
    for n, p in model.named_parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            grads[n] = p.grad.div_(dist.get_world_size())
    torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr).step()
    errors = _errors(out, ref_out, grads, ref_grads, dict(model.named_parameters()),
                     dict(serial.named_parameters()), before)
    errors.update(report=str(report), gradients=sorted(grads))
    return errors


def sample_edit(name: str, sp_group=None) -> torch.Tensor:
    """The edit pipeline ``name``'s image for one prompt and its reference(s) (fixed generator, true CFG), its
    transformer Ulysses-parallel over ``sp_group`` when given: [1, 3, 32, 32]. The pipelines' reference areas are
    shrunk to test size (48 x 48 pixels; Edit-Plus's vision prompt 32 x 32) for the call, as their conditioning
    test does."""
    from unittest import mock

    import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit as edit
    import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus as plus
    from PIL import Image

    from opendit_lite.families.tiny_pipelines import TINY_CALLS, build_tiny_pipeline
    from opendit_lite.parallelization import parallelize

    original = edit.calculate_dimensions
    with mock.patch.object(edit, "calculate_dimensions", lambda area, ratio: original(48 * 48, ratio)), \
            mock.patch.object(plus, "VAE_IMAGE_SIZE", 48 * 48), \
            mock.patch.object(plus, "CONDITION_IMAGE_SIZE", 32 * 32):
        pipe = build_tiny_pipeline(name)
        if sp_group is not None:
            report = parallelize(pipe.transformer, sp_group=sp_group, sp_mode="ulysses")
            assert "ulysses" in str(report), report
        rng = np.random.default_rng(0)
        pictures = [Image.fromarray(rng.integers(0, 255, (32, 64, 3), dtype=np.uint8)) for _ in range(REFERENCES[name])]
        with torch.no_grad():
            out = pipe(image=pictures[0] if len(pictures) == 1 else pictures, prompt=CAPTION, negative_prompt="",
                       true_cfg_scale=2.0, output_type="pt", generator=torch.Generator().manual_seed(3),
                       **TINY_CALLS[name])
    return out.images.float()


@rank_checks("qwen image edit", world_size=2)
def _world2(rank, world_size):
    warnings.filterwarnings("ignore")
    out = {f"lora {name}": _compare(mode, ring, lora=True) for name, (mode, ring) in MODES.items()}
    out["full ulysses"] = _compare("ulysses", None, lora=False)
    out["sampling"] = {name: sample_edit(name, dist.group.WORLD) for name in REFERENCES}
    return out


def test_qwen_image_edit_reference_tokens_split_with_the_target_at_sp2():
    per_rank = spawn_results("qwen image edit", 2)
    cases = [f"lora {name}" for name in MODES] + ["full ulysses"]
    for case in cases:
        worst = {k: max(r[case][k] for r in per_rank) for k in ("out", "grad", "step")}
        print(f"\n{case}: " + ", ".join(f"{k} {v:.2g}" for k, v in worst.items()), end="")
        assert per_rank[0][case]["missing"] == [], f"{case}: gradients on one side only"
        for what, value in worst.items():
            assert value < TOL, f"{case}: {what} differs by {value:.2e} (relative)"
    lora = per_rank[0]["lora ulysses"]["gradients"]
    assert lora and all(".lora_" in name for name in lora)                         # every adapter, nothing else
    from opendit_lite.families import FAMILIES
    from opendit_lite.models.lora import lora_target_names

    adapted = lora_target_names(fam.build("qwen_image"), FAMILIES["qwen_image"].lora_targets)
    assert len(lora) == 2 * len(adapted)                                           # A and B of each
    reports = {case: per_rank[0][case]["report"] for case in cases}
    assert "input 'hidden_states' along dim 1, padded to a multiple of 2" in reports["lora ulysses"]
    assert "ring over 2 ranks" in reports["lora ring"]
    assert "usp (ring 2 x ulysses 1)" in reports["lora usp ring 2"]
    assert "usp (ring 1 x ulysses 2)" in reports["lora usp ring 1"]


def test_qwen_image_edit_sampling_at_sp2_equals_one_process():
    """The edit pipelines (Edit with one reference, Edit-Plus with two) sampled with their transformer's tokens
    (target and references) split over 2 ranks (what sample.py does at sp_size=2) give the one-process image on
    every rank."""
    per_rank = spawn_results("qwen image edit", 2)
    for name in REFERENCES:
        serial = sample_edit(name)
        difference = max((results["sampling"][name] - serial).abs().max().item() for results in per_rank)
        print(f"\n{name} sampled at sp 2 vs one process: {difference:.2g}")
        assert difference <= 1e-5
