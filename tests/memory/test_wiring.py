"""``memory.blocks_to_swap`` and ``lora.base_precision`` through the config and ``parallelize``: the steps
run in their order (LoRA, base precision, ..., block swap, checkpointing wrapping the swapped forward),
the report says what was done, and settings that cannot apply end with exit 2 and one paragraph."""

import pytest
import torch

from opendit_lite.memory.block_swap import _SwappedForward
from opendit_lite.memory.low_precision import LowPrecisionLinear
from opendit_lite.parallelization import parallelize
from tests import diffusers_families as families
from tests.video_scripts.test_family_scripts import WAN, exits_2


def test_parallelize_applies_precision_then_swap_then_checkpointing():
    model = families.build("WanTransformer3DModel")
    report = parallelize(model, lora_rank=2, base_precision="fp8", blocks_to_swap=1, selective_ratio=0.0)
    steps = [row.step for row in report.rows]
    assert steps.index("lora") < steps.index("base_precision") < steps.index("block_swap") \
        < steps.index("activation_checkpointing")
    assert report.swap is not None and len(report.swap.swapped) == 1
    swapped = model.blocks[report.swap.swapped[0]]
    inner = vars(swapped)["forward"].forward  # the checkpointed forward wraps the swapped one ...
    assert isinstance(inner, _SwappedForward) and inner.recomputed_in_backward  # ... and told it so
    assert any(isinstance(m, LowPrecisionLinear) for m in swapped.modules())
    assert "block swapping: 1/2 blocks" in str(report) and "stored in fp8" in str(report)
    loss = families.loss(model, families.forward_inputs("WanTransformer3DModel"))
    loss.backward()
    assert report.swap.swapper.counts.fetches == 2
    assert all(p.grad is not None for n, p in model.named_parameters() if p.requires_grad)


@pytest.mark.parametrize("args,expected", [
    (["lora.base_precision=fp8"], "lora.rank=0 trains every weight"),
    (["memory.blocks_to_swap=1"], "a full fine-tune"),
    (["memory.gemini_offload_optim_frac=0.5"], "set zero_degree=3"),
    (["lora.rank=2", "memory.blocks_to_swap=3"], "more than the 2 blocks"),
    (["lora.base_precision=int4"], "lora.base_precision"),
    (["memory.blocks_to_swap=-1"], "blocks_to_swap"),
])
def test_settings_that_cannot_apply_exit_2(capsys, tmp_path, args, expected):
    err = exits_2(capsys, "train_video", [*WAN, f"results_dir={tmp_path}", "max_steps=1", *args])
    assert expected in err, err


def test_gemini_optimizer_offload_reaches_the_plugin(monkeypatch):
    from opendit_lite.config import from_dict
    from opendit_lite.config.video_schema import VideoTrainConfig
    from opendit_lite.training import loop

    seen = {}

    class Recording:
        def __init__(self, **kwargs):
            seen.update(kwargs)
            raise ValueError("stop here")

    monkeypatch.setattr(loop, "OpenDiTPlugin", Recording)
    cfg = from_dict(VideoTrainConfig, {"zero_degree": 3, "memory": {"gemini_offload_optim_frac": 0.5}})
    info = type("Info", (), {"local_world_size": 1, "device": torch.device("cpu")})()
    with pytest.raises(Exception, match="stop here"):
        loop.build_booster(cfg, info)
    assert seen["gemini_offload_optim_frac"] == 0.5


def test_wan22_experts_share_blocks_to_swap_and_match_the_unswapped_experts():
    """memory.blocks_to_swap counts both experts' blocks, as the planner does (3: two of the high-noise
    expert's, one of the low-noise expert's, each expert fetching its own); a batch split between the
    experts gives the loss and gradients of the same experts unswapped."""
    from opendit_lite.memory import swapped_blocks
    from tests.models.test_experts import call, experts, split_batch

    plain, swapped = (experts(2, base_precision="fp8", blocks_to_swap=n) for n in (0, 3))
    assert [sum(swapped_blocks(expert).values()) for _, expert in swapped.experts()] == [2, 1]
    inputs = split_batch([900.0, 100.0])  # one sample for each expert
    results = []
    for model in (plain, swapped):
        loss = call(model, inputs).square().mean()
        loss.backward()
        results.append((loss.item(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}))
    (want_loss, want), (got_loss, got) = results
    assert got_loss == pytest.approx(want_loss, rel=1e-6) and got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6, msg=name)
