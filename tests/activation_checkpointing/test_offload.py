"""The offloader's bookkeeping on CPU: what is copied out, in which order it comes back, when it
is freed.

On CPU the real offloader keeps tensors in place. Here ``_copier_for_device`` is patched to give
CPU tensors a stand-in for the CUDA copier that makes real host copies and logs every copy, so the
whole path (pack -> host copy -> prefetch -> unpack -> recomputation) runs and is checked against
the order the module docstring promises. The CUDA copier itself is covered in test_gpu.py.
"""

import copy
import gc
import weakref

import pytest
import torch

from opendit_lite.activation_checkpointing import apply_activation_checkpointing
from opendit_lite.activation_checkpointing import offload as offload_module
from tests.activation_checkpointing.toy_models import (
    SpatialTemporalModel,
    ToyDiT,
    assert_same_grads,
    grads_of,
    toy_inputs,
)


class RecordingCopier:
    """Copies to and from fresh CPU tensors and logs ("out"/"start"/"finish", host copy number)."""

    def __init__(self):
        self.log = []
        self.hosts = []  # weak references to every host copy, in the order they were made

    def number(self, host):
        return next(i for i, ref in enumerate(self.hosts) if ref() is host)

    def to_host(self, t):
        host = t.detach().clone()
        self.hosts.append(weakref.ref(host))
        self.log.append(("out", len(self.hosts) - 1))
        return host

    def start_to_device(self, host, device):
        self.log.append(("start", self.number(host)))
        return host.clone(), ("event", self.number(host))

    def finish_to_device(self, t, event):
        self.log.append(("finish", event[1]))
        return t


@pytest.fixture
def copier(monkeypatch):
    recording = RecordingCopier()
    monkeypatch.setattr(offload_module, "_copier_for_device", lambda device: recording)
    return recording


def expected_backward_log(num_blocks, per_block):
    """Backward copies for blocks whose inputs are host copies ``[i * per_block, (i+1) * per_block)``:
    the last block is copied back when reached; each block, on its first unpack, starts copying
    back the block before it, then consumes its own inputs in order."""
    def copies(block):
        return range(block * per_block, (block + 1) * per_block)

    log = []
    for block in reversed(range(num_blocks)):
        if block == num_blocks - 1:
            log += [("start", i) for i in copies(block)]
        if block > 0:
            log += [("start", i) for i in copies(block - 1)]
        log += [("finish", i) for i in copies(block)]
    return log


def test_copies_out_in_forward_and_prefetches_one_block_ahead(copier):
    torch.manual_seed(0)
    model = ToyDiT(depth=4).train()
    x, y = toy_inputs(model)
    _, ref = grads_of(copy.deepcopy(model), x, y)
    apply_activation_checkpointing(model, 0.0, offload=True)

    torch.manual_seed(1)
    out = model(x.detach().requires_grad_(True), y)
    # Each block saves two activations: its hidden state and the conditioning c (passed by
    # keyword, so it reaches the offloader only because arguments are flattened).
    assert copier.log == [("out", i) for i in range(8)]
    assert all(ref() is not None for ref in copier.hosts)  # held by the graph until backward
    copier.log.clear()
    out.square().mean().backward()
    assert copier.log == expected_backward_log(num_blocks=4, per_block=2)

    del out
    gc.collect()
    assert all(ref() is None for ref in copier.hosts), "host copies outlived the graph"
    _, got = grads_of(model, x, y)
    assert_same_grads(got, ref)


def test_selective_chain_skips_unchecked_blocks(copier):
    torch.manual_seed(0)
    model = SpatialTemporalModel(depth=2).train()  # 4 blocks: spatial 0, 1, temporal 0, 1 (module order)
    x, y = toy_inputs(model, tokens=3)
    _, ref = grads_of(copy.deepcopy(model), x, y)
    report = apply_activation_checkpointing(model, 0.5, offload=True)
    assert report.checkpointed_names == ("spatial_blocks.0", "temporal_blocks.0")
    _, got = grads_of(model, x, y)
    assert_same_grads(got, ref)
    # forward runs spatial 0 then temporal 0; backward brings temporal 0 back, then spatial 0
    backward = copier.log[4:]
    assert backward == expected_backward_log(num_blocks=2, per_block=2)


def test_kept_inputs_do_not_disturb_the_chain(copier):
    """A block whose first saved input stays in place (a constant table) still starts its
    predecessor's copy when backward reaches it, before consuming its own inputs."""

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, table, x):
            return x + self.lin(x) * table

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("table", torch.rand(4))
            self.blocks = torch.nn.ModuleList([Block() for _ in range(3)])

        def forward(self, x):
            for block in self.blocks:
                x = block(self.table, x)
            return x

    model = Model()
    apply_activation_checkpointing(model, 0.0, offload=True)
    out = model(torch.randn(2, 4) * torch.ones(1, requires_grad=True))
    copier.log.clear()
    out.sum().backward()
    assert copier.log == expected_backward_log(num_blocks=3, per_block=1)


def test_graph_dropped_without_backward_frees_host_copies(copier):
    model = ToyDiT(depth=3).train()
    apply_activation_checkpointing(model, 0.0, offload=True)
    x, y = toy_inputs(model)
    out = model(x, y)
    assert len(copier.hosts) == 6
    del out
    gc.collect()
    assert all(ref() is None for ref in copier.hosts)


def test_retained_graph_backward_twice_and_next_step_starts_a_new_chain(copier):
    torch.manual_seed(0)
    model = ToyDiT(depth=3).train()
    x, y = toy_inputs(model)
    ref_model = copy.deepcopy(model)
    apply_activation_checkpointing(model, 0.0, offload=True)

    torch.manual_seed(1)
    out = model(x, y)
    loss = out.square().mean()
    loss.backward(retain_graph=True)
    loss.backward()  # the host copies are still there and come back a second time
    torch.manual_seed(1)
    ref_out = ref_model(x, y)
    ref_loss = ref_out.square().mean()
    ref_loss.backward(retain_graph=True)
    ref_loss.backward()
    for (name, p), (_, q) in zip(model.named_parameters(), ref_model.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=1e-6, msg=name)

    # The first graph is still alive (out, loss), but it has been through backward: the next
    # forward must not chain onto it, or backward would prefetch that graph's inputs too.
    copier.log.clear()
    first_new = len(copier.hosts)
    model(x, y).square().mean().backward()
    started = {i for kind, i in copier.log if kind == "start"}
    assert started == set(range(first_new, first_new + 6))


def test_two_forwards_then_one_backward_chain_across_both(copier):
    # Accumulating two micro-batches into one loss: backward runs the second forward's blocks,
    # then the first's, and the prefetch chain follows.
    model = ToyDiT(depth=2).train()
    apply_activation_checkpointing(model, 0.0, offload=True)
    x, y = toy_inputs(model)
    loss = model(x, y).square().mean() + model(x * 2, y).square().mean()
    copier.log.clear()
    loss.backward()
    assert copier.log == expected_backward_log(num_blocks=4, per_block=2)


def test_parameters_and_constants_stay_in_place(copier):
    """Only activations (tensors with a grad_fn) are copied out."""

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.scale = torch.nn.Parameter(torch.ones(4))

        def forward(self, x, table, weight):
            return self.lin(x) * table * weight

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block(), Block()])
            self.table = torch.nn.Parameter(torch.rand(4), requires_grad=False)

        def forward(self, x):
            for b in self.blocks:
                x = b(x, self.table, b.scale)
            return x

    model = Model()
    apply_activation_checkpointing(model, 0.0, offload=True)
    x = torch.randn(3, 4, requires_grad=True)
    model(x).sum().backward()
    # block 0's input x is a leaf (no grad_fn): kept; block 1's input is an activation: copied
    assert [kind for kind, _ in copier.log].count("out") == 1


def test_deepcopy_gets_its_own_offloader(copier):
    """A copy of the model (an EMA model, say) must not share or chain onto the original's
    in-flight state: a deep copy of a weak reference would still point at the original's graph."""
    model = ToyDiT(depth=3).train()
    apply_activation_checkpointing(model, 0.0, offload=True)
    x, y = toy_inputs(model)
    out = model(x, y)  # the original's graph is in flight, not yet through backward
    twin = copy.deepcopy(model)
    offloaders = {id(b.forward.offloader) for b in twin.blocks}
    assert len(offloaders) == 1 and offloaders != {id(model.blocks[0].forward.offloader)}

    first_twin_copy = len(copier.hosts)
    copier.log.clear()
    twin(x, y).square().mean().backward()
    started = {i for kind, i in copier.log if kind == "start"}
    assert started == set(range(first_twin_copy, first_twin_copy + 6))  # only the twin's own inputs
    out.square().mean().backward()
