"""Frozen base weights in FP8 / NF4 (``lora.base_precision``): the layer computes exactly what a plain
linear layer with the dequantized weight computes (output, input and adapter gradients), saves only
the stored low-precision tensors for backward, survives the booster's casts, keeps the original
weights in its state dict (so a merged export merges into them), and a tiny LoRA run with FP8 or NF4
storage reaches the loss of bf16 storage within a stated bound.

bitsandbytes runs NF4 on the CPU here (bitsandbytes >= 0.45 ships CPU kernels), so the NF4 tests are
not GPU-only.
"""

import builtins

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from opendit_lite.builders.lora_checkpoint import load_merged
from opendit_lite.errors import ConfigError
from opendit_lite.memory import LowPrecisionLinear, apply_base_precision
from opendit_lite.memory.low_precision import FP8_MAX
from opendit_lite.models.lora import apply_lora
from tests.activation_checkpointing.toy_models import toy_inputs
from tests.memory.test_block_swap import adapted_toy, assert_same, step
from tests.training.test_lora import TARGETS, pretrained_tiny_dit

PRECISIONS = ("fp8", "nf4")


def dequantized_reference(model):
    """The adapted toy model with each low-precision layer's dequantized weight as a plain weight."""
    reference = adapted_toy()
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, LowPrecisionLinear):
                reference.get_submodule(name).weight.copy_(module.dequantize(module.stored(), torch.float32))
    return reference


@pytest.mark.parametrize("precision", PRECISIONS)
def test_layer_equals_a_linear_layer_with_the_dequantized_weight(precision):
    model = adapted_toy()
    x, y = toy_inputs(model)
    report = apply_base_precision(model, precision)
    # Every frozen linear layer of the blocks: 5 per block (qkv, proj and mlp.0 adapted, mlp.3, ada).
    assert report.layers == 5 * 4 and report.stored_bytes < report.original_bytes / (3 if precision == "fp8" else 6)
    assert_same(step(model, x, y), step(dequantized_reference(model), x, y))
    assert all(p.requires_grad == (".lora_" in n) for n, p in model.named_parameters())


@pytest.mark.parametrize("precision", PRECISIONS)
def test_quantization_error_is_that_of_the_format(precision):
    torch.manual_seed(0)
    linear = torch.nn.Linear(128, 64)
    with torch.no_grad():
        linear.weight.normal_(0, 0.02)  # typical pretrained magnitudes: e4m3 subnormals without a scale
    layer = LowPrecisionLinear(linear, precision)
    w = layer.dequantize(layer.stored(), torch.float32)
    relative = ((w - linear.weight).norm() / linear.weight.norm()).item()
    # e4m3 keeps 3 mantissa bits (relative step 2^-3, rms error ~2^-4/sqrt(3) ~ 3.6%); NF4: ~10%.
    assert relative < (0.04 if precision == "fp8" else 0.12), relative
    if precision == "fp8":
        assert layer.scale.shape == (64, 1)
        torch.testing.assert_close(layer.scale.squeeze(1) * FP8_MAX, linear.weight.abs().amax(dim=1))


@pytest.mark.parametrize("precision", PRECISIONS)
def test_backward_saves_only_the_stored_tensors(precision):
    """No weight-sized tensor in the compute dtype is kept for backward (why the layer is our own)."""
    torch.manual_seed(0)
    layer = LowPrecisionLinear(torch.nn.Linear(64, 96), precision)
    x = torch.randn(3, 64, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        layer(x).sum().backward()
    assert {(t.dtype, tuple(t.shape)) for t in saved} == {(s.dtype, tuple(s.shape)) for s in layer.stored()}


@pytest.mark.parametrize("precision", PRECISIONS)
def test_casts_keep_the_storage_and_state_dict_keeps_the_original(precision):
    model = adapted_toy()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    names = apply_base_precision(model, precision).names
    stored = {n: (t.dtype, t.clone()) for n, m in model.named_modules() if isinstance(m, LowPrecisionLinear)
              for t in m.stored()[:1]}
    model.to(torch.bfloat16)
    for name, module in model.named_modules():
        if isinstance(module, LowPrecisionLinear):
            assert module.weight.dtype == stored[name][0] and torch.equal(module.weight, stored[name][1])
            if precision == "fp8":
                assert module.scale.dtype == torch.float32
    model.to(torch.float32)
    state = model.state_dict()
    assert state.keys() == before.keys()
    for name in names:  # the originals, not rounded by the bf16 round trip of the rest of the model
        torch.testing.assert_close(state[name + ".weight"], before[name + ".weight"], rtol=0, atol=0, msg=name)
    # Loading original weights quantizes them again (what resume does).
    fresh = adapted_toy(seed=1)
    apply_base_precision(fresh, precision)
    fresh.load_state_dict(state)
    x, y = toy_inputs(model)
    assert_same(step(fresh, x, y), step(model, x, y))


@pytest.mark.parametrize("precision", PRECISIONS)
def test_merged_export_merges_into_the_original_weights(precision, tmp_path):
    model = pretrained_tiny_dit()
    original = {k: v.clone() for k, v in model.state_dict().items()}
    lora = dict(rank=4, alpha=8.0, dropout=0.0, targets=TARGETS, base_precision=precision)
    apply_lora(model, rank=4, alpha=8.0, dropout=0.0, targets=TARGETS)
    apply_base_precision(model, precision)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.normal_(0, 0.1)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "ckpt.safetensors"))
    merged = load_merged(pretrained_tiny_dit(), str(tmp_path / "ckpt.safetensors"), use_ema=False, lora=lora)
    adapters = dict(model.named_parameters())
    scale = 8.0 / 4
    for layer in ("blocks.0.attn.qkv", "blocks.1.mlp.fc2"):
        a, b = adapters[f"{layer}.lora_A.default.weight"], adapters[f"{layer}.lora_B.default.weight"]
        want = original[f"{layer}.weight"] + scale * b @ a
        torch.testing.assert_close(merged.get_submodule(layer).weight, want, rtol=1e-6, atol=1e-6)


def lora_run(precision: str, steps: int = 20) -> list:
    """Train adapters of a DiT to imitate the same DiT with a low-rank change to every MLP input layer;
    the frozen base stored in ``precision`` ("bf16": the weights rounded to bf16, what a bf16 run
    stores). Computation in fp32 (what differs is the storage; fp32 is fast on the CPU). Returns the
    losses."""
    teacher = pretrained_tiny_dit()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for block in teacher.blocks:
            w = block.mlp.fc1.weight
            w.add_(torch.randn(w.shape[0], 2, generator=g) @ torch.randn(2, w.shape[1], generator=g) * 0.05)
        for p in teacher.parameters():
            p.copy_(p.to(torch.bfloat16))
    model = pretrained_tiny_dit()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16))
    apply_lora(model, rank=4, alpha=8.0, dropout=0.0, targets=TARGETS)
    apply_base_precision(model, "none" if precision == "bf16" else precision)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    losses = []
    for _ in range(steps):
        x = torch.randn(8, 4, 8, 8, generator=g)
        t = torch.randint(0, 1000, (8,), generator=g)
        y = torch.randint(0, 10, (8,), generator=g)
        with torch.no_grad():
            target = teacher(x, t, y)
        loss = F.mse_loss(model(x, t, y), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_low_precision_storage_trains_to_the_loss_of_bf16_storage():
    """Bound: the mean loss of the last 5 steps is within 10% (FP8; measured +0.8%) / 40% (NF4; measured +22%,
    the 4-bit base error the adapters cannot undo) of bf16 storage's,
    while training lowers it to less than half of the first steps' loss."""
    bf16 = lora_run("bf16")
    assert sum(bf16[-5:]) < 0.5 * sum(bf16[:5])
    for precision, bound in (("fp8", 0.10), ("nf4", 0.40)):
        losses = lora_run(precision)
        assert abs(sum(losses[-5:]) / sum(bf16[-5:]) - 1) < bound, (precision, losses[-5:], bf16[-5:])


def test_refusals_are_one_paragraph(monkeypatch):
    torch.manual_seed(0)
    with pytest.raises(ConfigError, match="needs LoRA"):
        apply_base_precision(pretrained_tiny_dit().requires_grad_(True), "fp8")
    with pytest.raises(ConfigError, match="is not one of"):
        apply_base_precision(adapted_toy(), "int3")
    real_import = builtins.__import__

    def no_bitsandbytes(name, *args, **kwargs):
        if name.startswith("bitsandbytes"):
            raise ImportError("No module named 'bitsandbytes'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_bitsandbytes)
    with pytest.raises(ConfigError, match="pip install bitsandbytes"):
        apply_base_precision(adapted_toy(), "nf4")
    assert str(apply_base_precision(adapted_toy(), "none")) == "base precision: as loaded"
