"""Activation offload on CUDA: the real copier (side stream, pinned memory, events).

Memory readings go through ``settled_memory``: a tensor used on two streams is released by the
caching allocator only at its next allocation after the other stream's work has finished, so
the reading synchronises and allocates once before asking; and it collects garbage first, so that
objects of earlier tests in the same process (freed whenever the cycle collector happens to run)
cannot be released in the middle of a measurement.
"""

import gc

import pytest
import torch

from opendit_lite.activation_checkpointing import apply_activation_checkpointing
from tests.activation_checkpointing.toy_models import ToyDiT, assert_same_grads, grads_of, toy_inputs

pytestmark = pytest.mark.gpu

DEPTH, DIM, TOKENS, BATCH = 6, 64, 1024, 2
BLOCK_INPUT_BYTES = BATCH * TOKENS * DIM * 4  # one fp32 hidden state [B, N, D]


def settled_memory() -> int:
    gc.collect()
    torch.cuda.synchronize()
    torch.empty(1, device="cuda")  # lets the allocator release blocks whose other-stream uses are done
    return torch.cuda.memory_allocated()


def make_model(ratio=None, offload=False):
    torch.manual_seed(0)
    model = ToyDiT(depth=DEPTH, dim=DIM).cuda().train()
    if ratio is not None:
        apply_activation_checkpointing(model, ratio, offload=offload)
    return model


def test_offload_gradients_match_on_cuda():
    plain = make_model()
    x, y = toy_inputs(plain, batch=BATCH, tokens=TOKENS, device="cuda")
    _, ref = grads_of(plain, x, y)
    for ratio in (0.0, 0.5):
        _, ckpt = grads_of(make_model(ratio), x, y)
        _, offloaded = grads_of(make_model(ratio, offload=True), x, y)
        assert_same_grads(offloaded, ckpt, atol=1e-6)  # same kernels on bit-identical restored inputs
        assert_same_grads(offloaded, ref, atol=1e-5)


def test_offload_keeps_block_inputs_off_the_gpu():
    held = {}
    for offload in (False, True):
        model = make_model(0.0, offload=offload)
        x, y = toy_inputs(model, batch=BATCH, tokens=TOKENS, device="cuda")
        before = settled_memory()
        out = model(x, y)
        held[offload] = settled_memory() - before
        out.square().mean().backward()
        del out, model
    # Checkpointing alone keeps every block's input until backward; offload keeps none of them.
    assert held[False] - held[True] >= DEPTH * BLOCK_INPUT_BYTES, held


def test_memory_returns_to_baseline_and_pinned_memory_is_reused():
    model = make_model(0.0, offload=True)
    x, y = toy_inputs(model, batch=BATCH, tokens=TOKENS, device="cuda")

    def step():
        model(x, y).square().mean().backward()  # gradients accumulate into the same tensors
        return settled_memory()

    baseline = step()  # the first step allocates the gradients
    step()             # by now the pinned (host) allocator has cached every buffer it needs
    host_allocs = torch.cuda.host_memory_stats()["num_host_alloc"]
    for _ in range(3):
        assert step() == baseline, "GPU memory changed across steps"
    assert torch.cuda.host_memory_stats()["num_host_alloc"] == host_allocs, \
        "new pinned memory was allocated in later steps: host copies were leaked instead of reused"
