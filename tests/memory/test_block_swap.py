"""Block swapping on the CPU: a LoRA-adapted model with N blocks' frozen weights in "host" memory gives
the loss and every gradient of the same model without swapping, with and without activation
checkpointing (and its input offload), and the copies per step are counted: N blocks x (1 forward +
1 backward or recomputation) host -> device, in forward order then in reverse, none device -> host.

On the CPU "host" and "device" are the same memory, but every fetch is a fresh copy (``SyncCopier``),
so the tests also see that between calls the swapped parameters point at the host copies again and
that backward computes with a copy fetched in backward, not one kept from forward.
"""

import pytest
import torch

from opendit_lite.activation_checkpointing import apply_activation_checkpointing
from opendit_lite.activation_checkpointing import offload as offload_module
from opendit_lite.errors import ConfigError
from opendit_lite.memory import apply_block_swap, swapped_indices
from opendit_lite.models.lora import apply_lora
from tests.activation_checkpointing.test_offload import RecordingCopier
from tests.activation_checkpointing.toy_models import ToyDiT, toy_inputs

DEPTH = 4


def adapted_toy(seed: int = 0, depth: int = DEPTH) -> ToyDiT:
    """A ToyDiT with every weight random and LoRA adapters on attention and the MLP's first layer."""
    torch.manual_seed(seed)
    model = ToyDiT(depth=depth).train()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    apply_lora(model, rank=2, alpha=4.0, dropout=0.0, targets=["qkv", "proj", "mlp.0"])
    with torch.no_grad():  # non-zero B: the adapters change the output and pass gradients to A
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.2)
    return model


def step(model, x, y, seed: int = 0):
    """Loss, gradients of the trainable parameters and of the input, after one backward."""
    model.zero_grad()
    x = x.detach().clone().requires_grad_()
    torch.manual_seed(seed)  # the blocks' dropout
    loss = model(x, y).square().mean()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), grads, x.grad


def assert_same(got, want):
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    assert got[1].keys() == want[1].keys() and got[1]
    for name in want[1]:
        torch.testing.assert_close(got[1][name], want[1][name], rtol=0, atol=0, msg=name)
    torch.testing.assert_close(got[2], want[2], rtol=0, atol=0)


def expected_order(indices):
    return [(i, "forward") for i in indices] + [(i, "backward") for i in reversed(indices)]


@pytest.mark.parametrize("n,checkpoint", [(1, "none"), (2, "none"), (DEPTH, "none"), (2, "half"), (DEPTH, "all"),
                                          (2, "all+offload")])
def test_swapped_model_gives_the_same_loss_and_gradients(n, checkpoint, monkeypatch):
    x, y = toy_inputs(adapted_toy())
    reference, model = adapted_toy(), adapted_toy()
    report = apply_block_swap(model, n)
    if checkpoint != "none":
        ratio = 0.5 if checkpoint == "half" else 0.0
        offload = checkpoint.endswith("offload")
        if offload:  # real host copies of the checkpointed inputs, as in the offload tests
            monkeypatch.setattr(offload_module, "_copier_for_device", lambda device: RecordingCopier())
        for m in (reference, model):
            apply_activation_checkpointing(m, ratio, offload=offload)
    counts = report.swapper.counts
    want = step(reference, x, y)
    for s in range(2):  # two steps: nothing is left over from the first
        counts.reset()
        assert_same(step(model, x, y), want)
        assert counts.fetches == 2 * n and counts.stores == 0
        assert counts.order == expected_order(report.swapped)
        assert counts.fetch_bytes == 2 * report.host_bytes
    # Between calls every swapped tensor is its host copy again.
    for block in report.swapper.blocks:
        for slot in block.slots:
            assert slot.current().data_ptr() == slot.host.data_ptr()


def test_only_frozen_tensors_move_and_adapters_stay():
    model = adapted_toy()
    report = apply_block_swap(model, 2)
    adapters = {id(p) for n, p in model.named_parameters() if ".lora_" in n}
    moved = {id(slot.current()) for b in report.swapper.blocks for slot in b.slots}
    assert moved and not moved & adapters
    frozen_in_swapped = sum(p.numel() * p.element_size() for i in report.swapped
                            for p in model.blocks[i].parameters() if not p.requires_grad)
    assert report.host_bytes == frozen_in_swapped
    assert report.resident_trainable == sum(p.numel() for i in report.swapped
                                            for p in model.blocks[i].parameters() if p.requires_grad)
    names = set(model._ddp_params_and_buffers_to_ignore)
    assert "blocks.1.attn.qkv.base_layer.weight" in names and not any(".lora_" in n for n in names)
    assert "swapped" in str(report) or "blocks" in str(report)


def test_backward_computes_with_a_copy_fetched_in_backward():
    """Poison the host copies after forward: a backward that kept forward's device weights would not
    see it; this one fetches again and its input gradient changes."""
    x, y = toy_inputs(adapted_toy())
    model = adapted_toy()
    report = apply_block_swap(model, DEPTH)
    x = x.detach().clone().requires_grad_()
    loss = model(x, y).square().mean()
    for block in report.swapper.blocks:
        for slot in block.slots:
            slot.host.mul_(0)  # in place: the host copies the next fetch reads
    loss.backward()
    clean = adapted_toy()
    x2 = x.detach().clone().requires_grad_()
    clean(x2, y).square().mean().backward()
    assert not torch.allclose(x.grad, x2.grad)


def test_placement_casts_the_host_copies_and_leaves_them_on_the_host():
    x, y = toy_inputs(adapted_toy())
    reference, model = adapted_toy().double(), adapted_toy()
    report = apply_block_swap(model, 2)
    model.to(torch.float64)
    for block in report.swapper.blocks:
        for slot in block.slots:
            assert slot.host.dtype == torch.float64 and slot.current().data_ptr() == slot.host.data_ptr()
    assert_same(step(model, x.double(), y.double()), step(reference, x.double(), y.double()))


def test_blocks_are_spread_over_depth():
    assert swapped_indices(8, 2) == [2, 6]
    assert swapped_indices(4, 4) == [0, 1, 2, 3]
    assert swapped_indices(40, 16)[:3] == [1, 3, 6]
    assert len(set(swapped_indices(40, 16))) == 16


def test_refusals_are_one_paragraph():
    with pytest.raises(ConfigError, match="more than the 4 blocks"):
        apply_block_swap(adapted_toy(), 5)
    torch.manual_seed(0)
    full = ToyDiT(depth=4)  # every parameter trains: a full fine-tune
    with pytest.raises(ConfigError, match="full fine-tune"):
        apply_block_swap(full, 2)
    assert str(apply_block_swap(full, 0)) == "block swapping: off"
