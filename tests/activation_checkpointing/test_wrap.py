"""apply_activation_checkpointing on CPU: same gradients, same state-dict keys, clear errors.

On CPU the offloader is a pass-through; its copy path is exercised in test_offload.py (with a
host-copy stand-in for the CUDA copier) and on CUDA in test_gpu.py.
"""

import copy

import pytest
import torch

from opendit_lite.activation_checkpointing import CheckpointReport, apply_activation_checkpointing
from opendit_lite.activation_checkpointing.wrap import _CheckpointedForward
from opendit_lite.models.dit import DiT
from tests.activation_checkpointing.toy_models import (
    DeclaredToyDiT,
    NestedBlocksModel,
    SequentialModel,
    SpatialTemporalModel,
    ToyDiT,
    UserModel,
    assert_same_grads,
    grads_of,
    toy_inputs,
)


def checkpointed_copy(model, ratio, offload):
    wrapped = copy.deepcopy(model)
    return wrapped, apply_activation_checkpointing(wrapped, ratio, offload=offload)


@pytest.mark.parametrize("offload", [False, True], ids=["ckpt", "ckpt+offload"])
@pytest.mark.parametrize("ratio", [0.0, 0.25, 0.5, 1.0])
def test_gradients_match_without_checkpointing(ratio, offload):
    torch.manual_seed(0)
    model = ToyDiT(depth=8).train()
    x, y = toy_inputs(model)
    out_ref, ref = grads_of(model, x, y)
    if offload and ratio == 1.0:
        with pytest.raises(ValueError, match="checkpoints none"):
            checkpointed_copy(model, ratio, offload)
        return
    wrapped, report = checkpointed_copy(model, ratio, offload)
    assert len(report.checkpointed) == 8 - int(ratio * 8)
    out, got = grads_of(wrapped, x, y)
    assert torch.equal(out, out_ref)
    assert_same_grads(got, ref)


@pytest.mark.parametrize("model_cls", [DeclaredToyDiT, NestedBlocksModel, SpatialTemporalModel,
                                       SequentialModel, UserModel])
def test_gradients_match_on_every_layout(model_cls):
    torch.manual_seed(0)
    model = model_cls().train()
    x, y = toy_inputs(model)
    _, ref = grads_of(model, x, y)
    wrapped, report = checkpointed_copy(model, 0.5, offload=True)
    assert report.checkpointed
    _, got = grads_of(wrapped, x, y)
    assert_same_grads(got, ref)


def test_gradients_match_on_dit():
    torch.manual_seed(0)
    model = DiT(input_size=4, depth=4, hidden_size=32, num_heads=2, num_classes=4).train()
    for p in model.parameters():  # leave adaLN-Zero's zero init, so every block contributes
        torch.nn.init.normal_(p, std=0.05) if p.requires_grad else None
    x, t, y = torch.randn(2, 4, 4, 4), torch.tensor([3, 700]), torch.tensor([1, 2])

    def grads(m):
        m.zero_grad(set_to_none=True)
        torch.manual_seed(1)  # label dropout
        m(x, t, y).square().mean().backward()
        return {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}

    ref = grads(model)
    wrapped, report = checkpointed_copy(model, 0.0, offload=True)
    assert report.source == "get_fsdp_wrap_module_list()"
    assert_same_grads(grads(wrapped), ref)


def test_state_dict_keys_and_loading_unchanged():
    torch.manual_seed(0)
    model = ToyDiT(depth=4)
    wrapped, _ = checkpointed_copy(model, 0.0, offload=True)
    assert list(wrapped.state_dict()) == list(model.state_dict())
    assert [n for n, _ in wrapped.named_parameters()] == [n for n, _ in model.named_parameters()]
    plain = ToyDiT(depth=4)
    plain.load_state_dict(wrapped.state_dict())              # a checkpointed model's checkpoint loads
    wrapped.load_state_dict(ToyDiT(depth=4).state_dict())    # and the other way round


def test_no_grad_forward_runs_the_block_directly():
    torch.manual_seed(0)
    model = ToyDiT(depth=4).eval()
    x, y = toy_inputs(model)
    wrapped, _ = checkpointed_copy(model, 0.0, offload=True)
    with torch.no_grad():
        assert torch.equal(wrapped(x, y), model(x, y))


def test_report():
    model = ToyDiT(depth=8)
    report = apply_activation_checkpointing(model, 0.25, offload=True)
    assert isinstance(report, CheckpointReport)
    assert report.blocks == tuple(f"blocks.{i}" for i in range(8))
    assert report.checkpointed == (0, 1, 3, 4, 5, 7)  # 2 of 8 left out: the middle of each half
    assert report.checkpointed_names[:3] == ("blocks.0", "blocks.1", "blocks.3")
    assert report.source == "detected ToyBlock blocks"
    assert str(report) == ("activation checkpointing: 6/8 blocks (detected ToyBlock blocks), inputs offloaded "
                           "to CPU; not checkpointed: blocks.2, blocks.6")
    # only the chosen blocks are wrapped, and they share one offloader
    wrapped = [i for i, b in enumerate(model.blocks) if isinstance(vars(b).get("forward"), _CheckpointedForward)]
    assert wrapped == [0, 1, 3, 4, 5, 7]
    assert len({id(model.blocks[i].forward.offloader) for i in wrapped}) == 1


def test_applying_twice_is_an_error():
    model = ToyDiT(depth=4)
    apply_activation_checkpointing(model, 0.5)
    with pytest.raises(RuntimeError, match="already applied"):
        apply_activation_checkpointing(model, 0.0)


def test_each_parameter_gradient_accumulates_once():
    """ZeRO-1/2 reduce from post-accumulate-grad hooks, Gemini from tensor grad hooks: both must
    fire once per parameter per backward, as without checkpointing."""
    torch.manual_seed(0)
    model = ToyDiT(depth=4).train()
    x, y = toy_inputs(model)

    def hook_counts(m):
        counts = {}
        handles = []
        for name, p in m.named_parameters():
            counts[name] = [0, 0]
            handles.append(p.register_hook(lambda g, n=name: counts[n].__setitem__(0, counts[n][0] + 1)))
            handles.append(p.register_post_accumulate_grad_hook(
                lambda p, n=name: counts[n].__setitem__(1, counts[n][1] + 1)))
        grads_of(m, x, y)
        for h in handles:
            h.remove()
        return counts

    expected = hook_counts(model)
    assert all(c == [1, 1] for c in expected.values())
    wrapped, _ = checkpointed_copy(model, 0.0, offload=True)
    assert hook_counts(wrapped) == expected


def test_a_checkpointed_model_is_freed_without_the_cycle_collector():
    """The installed forward holds its block weakly: dropping the model frees it (and its device memory)
    at once, not at the cyclic garbage collector's next pass."""
    import gc
    import weakref

    model = ToyDiT(depth=4)
    apply_activation_checkpointing(model, 0.0, offload=True)
    gone = weakref.ref(model.blocks[0])
    gc.disable()
    try:
        del model
        assert gone() is None
    finally:
        gc.enable()


def test_a_copy_of_a_checkpointed_model_runs_its_own_blocks():
    """deepcopy (EMA replicas) rebinds each checkpointed forward to the copy's block, with a fresh offloader."""
    torch.manual_seed(0)
    model = ToyDiT(depth=4).train()
    apply_activation_checkpointing(model, 0.0, offload=True)
    replica = copy.deepcopy(model)
    assert replica.blocks[1].forward.forward.__self__ is replica.blocks[1]
    assert replica.blocks[1].forward.offloader is not model.blocks[1].forward.offloader
    with torch.no_grad():
        for p in replica.parameters():
            p.mul_(0.5)
    x, y = toy_inputs(model)
    _, grads = grads_of(replica, x, y)
    assert replica.blocks[0].ada.weight.grad is not None and model.blocks[0].ada.weight.grad is None
    assert not torch.equal(replica(x, y), model(x, y))
