"""parallelize() in one process: the report table, the stderr warning for a kernel swap that matched
nothing, each step against a reference model written here (the unconverted model), compile per
block (eager backend; one real inductor compile), declared capabilities, and the lazy import."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from opendit_lite.config import ConfigError
from opendit_lite.models import DiT, build_model
from opendit_lite.models.capabilities import guidance_layout, is_video_model, supported_sp_modes
from opendit_lite.parallelization import ParallelizeReport, apply_compile, parallelize


def tiny_dit() -> nn.Module:
    torch.manual_seed(0)
    model = build_model("DiT-T/2", input_size=8, num_classes=10, class_dropout_prob=0.0)
    with torch.no_grad():  # DiT zero-initialises its adaLN and output layers: give every weight a gradient
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def loss_and_grads(model: nn.Module, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    x, t, y = torch.randn(2, 4, 8, 8, generator=g), torch.tensor([3, 700]), torch.tensor([1, 7])
    loss = F.mse_loss(model(x, t, y), torch.randn(2, 8, 8, 8, generator=g))
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_training_step(model: nn.Module, reference: nn.Module) -> None:
    loss, grads = loss_and_grads(model)
    ref_loss, ref_grads = loss_and_grads(reference)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-4, atol=1e-5, msg=name)


def test_report_prints_a_table_of_every_step():
    model = tiny_dit()
    report = parallelize(model, fused_adaln=True, selective_ratio=0.5)
    text = str(report)
    lines = text.splitlines()
    assert lines[0] == "parallelize:" and lines[1].split()[:2] == ["step", "swapped"]
    steps = [line.split()[0] for line in lines[2:] if line[2] != " "]  # not the wrapped continuation lines
    assert steps == ["lora", "base_precision"] + ["kernels"] * 3 + ["sequence_parallel", "block_swap",
                                                                    "activation_checkpointing", "compile"]
    assert report.count("lora") == 0 and "lora rank 0: every parameter trains" in text
    assert "LayerNormModulate -> FusedLayerNormModulate" in text
    assert report.count("kernels") == 5          # norm1, norm2 of 2 blocks and the final norm
    assert report.count("sequence_parallel") == 0 and "sp_group has 1 rank" in text
    assert report.count("activation_checkpointing") == 1 and "1 of 2 blocks not (selective_ratio=0.5)" in text
    assert report.count("compile") == 0 and "compile=false" in text
    assert report.checkpointing.checkpointed == (0,) and report.conversion.counts()["fused_adaln"] == 5


def test_kernel_swap_that_matched_nothing_warns():
    model = tiny_dit()  # DiT's LayerNorms carry no weight and bias: nothing for the fused LayerNorm
    with pytest.warns(UserWarning, match="fused_layernorm was requested but matched nothing in DiT") as record:
        report = parallelize(model, fused_layernorm=True)
    # A UserWarning, which Python's default filters print on stderr (not a logging record).
    assert record[0].category is UserWarning
    assert "matched nothing (warned)" in str(report)


def test_flash_requested_without_flash_attn_warns(monkeypatch):
    import opendit_lite.kernels.flash_attention as flash

    monkeypatch.setattr(flash, "flash_attn_version", lambda: None)
    with pytest.warns(UserWarning, match="attention_backend='flash' was requested but kept SDPA"):
        parallelize(tiny_dit(), attention_backend="flash")


def test_all_steps_keep_the_training_step():
    """Kernels + checkpointing with offload + compile (eager backend) give the reference's loss and
    gradients, and keep the state-dict keys."""
    reference = tiny_dit()
    model = copy.deepcopy(reference)
    report = parallelize(model, fused_adaln=True, selective_ratio=0.0, ac_offload=True, compile=True,
                         compile_backend="eager")
    assert report.count("activation_checkpointing") == 2 and report.count("compile") == 2
    assert model.state_dict().keys() == reference.state_dict().keys()
    assert_same_training_step(model, reference)


def test_compile_wraps_every_block():
    model = tiny_dit()
    reference = copy.deepcopy(model)
    parallelize(model, compile=True, compile_backend="eager")
    assert all(block._compiled_call_impl is not None for block in model.blocks)
    assert model.x_embedder._compiled_call_impl is None  # only the blocks
    assert_same_training_step(model, reference)


def test_compile_off_leaves_blocks_alone():
    model = tiny_dit()
    rows = apply_compile(model, enabled=False)
    assert rows[0].count == 0 and all(block._compiled_call_impl is None for block in model.blocks)


@pytest.mark.slow
def test_compile_for_real_with_inductor():
    """One real inductor compile of a one-block model (skipped where inductor has no toolchain)."""
    torch.manual_seed(0)
    model = DiT(input_size=4, patch_size=2, in_channels=4, hidden_size=32, depth=1, num_heads=2, num_classes=2)
    reference = copy.deepcopy(model)
    parallelize(model, compile=True)
    x, t, y = torch.randn(1, 4, 4, 4), torch.tensor([5]), torch.tensor([1])
    try:
        with torch.no_grad():
            out = model(x, t, y)
    except Exception as e:  # no working C++ toolchain for inductor on this machine
        pytest.skip(f"inductor cannot compile here: {type(e).__name__}: {e}")
    with torch.no_grad():
        torch.testing.assert_close(out, reference(x, t, y), rtol=1e-4, atol=1e-5)


def test_model_that_refuses_checkpointing():
    class NoCheckpointing(nn.Module):
        supports_gradient_checkpointing = False

        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])

    with pytest.raises(ConfigError, match="declares supports_gradient_checkpointing = False"):
        parallelize(NoCheckpointing(), selective_ratio=0.0)
    parallelize(NoCheckpointing())  # checkpointing off: fine


def test_capabilities_are_declared():
    from opendit_lite.models import DiT, STDiT, VchitectXL

    assert [is_video_model(c) for c in (DiT, STDiT, VchitectXL)] == [False, True, True]
    assert supported_sp_modes(STDiT) == ("ulysses", "ring", "usp", "dsp")
    assert supported_sp_modes(VchitectXL) == ("ulysses", "ring", "usp")
    assert supported_sp_modes(nn.Linear) == ("ulysses", "ring", "usp")  # undeclared: the default
    assert [guidance_layout(c) for c in (DiT, STDiT, VchitectXL, nn.Linear)] == ["concat", "paired", "paired", None]


def test_lazy_import_from_the_package():
    import opendit_lite
    from opendit_lite import ParallelizeReport as LazyReport
    from opendit_lite import parallelize as lazy

    assert LazyReport is ParallelizeReport and callable(lazy) and callable(opendit_lite.parallelize)
    assert isinstance(opendit_lite.parallelize(tiny_dit()), ParallelizeReport)


def test_package_parallelize_is_the_function_with_its_signature():
    """``from opendit_lite import parallelize`` is the function itself, so help() and editors show
    its keyword arguments, not a module's ``(model, **kwargs)``."""
    import inspect
    import types

    import opendit_lite
    from opendit_lite import parallelize as from_package

    assert isinstance(from_package, types.FunctionType) and from_package is parallelize
    assert opendit_lite.parallelize is parallelize
    params = inspect.signature(from_package).parameters
    assert list(params) == ["model", "sp_group", "sp_mode", "sp_ring_size", "sp_auto", "fused_adaln",
                            "fused_layernorm", "attention_backend", "selective_ratio", "ac_offload", "compile",
                            "compile_backend", "cuda_graphs", "lora_rank", "lora_alpha", "lora_dropout",
                            "lora_targets", "base_precision", "blocks_to_swap"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for name, p in params.items() if name != "model")
    assert inspect.signature(from_package).return_annotation is ParallelizeReport


def test_trainers_read_is_video():
    from opendit_lite.builders.video import build_video_model
    from opendit_lite.config import load_config
    from opendit_lite.config.video_schema import VideoTrainConfig
    from opendit_lite.training.image import build_image_model

    with pytest.raises(ConfigError, match="declares is_video = True"):
        build_image_model(load_config(None, ["model.name=STDiT-tiny"]))
    with pytest.raises(ConfigError, match="is an image model"):
        build_video_model(load_config(None, ["model.name=DiT-T/2"], schema=VideoTrainConfig))
