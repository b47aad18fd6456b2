"""Block swapping and low-precision base weights on a CUDA device: the stream copier (pinned host
copies, a side stream, events) gives the plain model's loss and gradients, placement keeps the swapped
weights in pinned host memory, the device holds at most two swapped blocks at a time, and FP8/NF4
layers match their dequantized reference on the GPU."""

import pytest
import torch

from opendit_lite.activation_checkpointing import apply_activation_checkpointing
from opendit_lite.memory import StreamCopier, apply_base_precision, apply_block_swap
from tests.activation_checkpointing.toy_models import ToyDiT, toy_inputs
from tests.memory.test_block_swap import adapted_toy, step

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA GPU; none is visible (torch.cuda.is_available() is False)"),
]


def close(got, want, tol=1e-5):
    torch.testing.assert_close(got[0], want[0], rtol=tol, atol=tol)
    for name in want[1]:
        torch.testing.assert_close(got[1][name], want[1][name], rtol=tol, atol=tol, msg=name)
    torch.testing.assert_close(got[2], want[2], rtol=tol, atol=tol)


@pytest.mark.parametrize("checkpoint", ["none", "all", "all+offload"])
def test_stream_copier_gives_the_plain_model_on_cuda(checkpoint):
    x, y = toy_inputs(adapted_toy(), device="cuda")
    reference, model = adapted_toy().cuda(), adapted_toy()
    report = apply_block_swap(model, 2)
    if checkpoint != "none":
        for m in (reference, model):
            apply_activation_checkpointing(m, 0.0, offload=checkpoint.endswith("offload"))
    model.cuda()  # placement after swapping: the swapped tensors stay on the host
    assert isinstance(report.swapper.copier, StreamCopier)
    for block in report.swapper.blocks:
        for slot in block.slots:
            assert slot.host.device.type == "cpu" and slot.host.is_pinned()
            assert slot.current().data_ptr() == slot.host.data_ptr()
        # One page-locked buffer of the block's size (plus alignment), not a power of two per tensor.
        assert block.owner.registered and block.owner.buffer.numel() <= block.nbytes + 256 * len(block.slots)
    want = step(reference, x, y)
    for _ in range(2):
        report.swapper.counts.reset()
        close(step(model, x, y), want)
        assert report.swapper.counts.fetches == 4 and report.swapper.counts.stores == 0


def test_device_holds_the_resident_blocks_and_two_swapped_ones():
    """A model of wide blocks: the peak over a step exceeds the resident weights by about two blocks
    (the running one and the prefetched one), not by the swapped ones."""
    torch.manual_seed(0)
    model = ToyDiT(depth=8, dim=512).requires_grad_(False)
    block_bytes = sum(p.numel() * p.element_size() for p in model.blocks[0].parameters())
    apply_block_swap(model, 6)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    model.cuda()
    resident = torch.cuda.memory_allocated() - before
    assert resident < 3 * block_bytes + block_bytes  # 2 resident blocks + embedders, not 8 blocks
    x, y = toy_inputs(model, in_dim=4, device="cuda")
    with torch.no_grad():
        model(x, y)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before - resident
    assert extra < 2.5 * block_bytes, (extra / block_bytes)


@pytest.mark.parametrize("precision", ["fp8", "nf4"])
def test_low_precision_layers_on_cuda(precision):
    from tests.memory.test_low_precision import dequantized_reference

    model = adapted_toy()
    apply_base_precision(model, precision)
    reference = dequantized_reference(model).cuda()
    model.cuda()
    x, y = toy_inputs(model, device="cuda")
    close(step(model, x, y), step(reference, x, y), tol=1e-4)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(x, y)
    assert out.dtype == torch.bfloat16
