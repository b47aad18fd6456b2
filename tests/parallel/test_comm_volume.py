"""The communication formulas (``opendit_lite.parallel.comm_volume``) against the bytes the real
sequence-parallel ops hand to the collectives on gloo: tiny DiT, STDiT and Vchitect-style models, one
training step (forward + backward) under ulysses, ring, usp and dsp at 2 and 4 ranks, with token counts
that do not divide the group.

Each rank counts what it sends by wrapping torch.distributed's collectives and P2P sends with the
per-rank conventions written here (the reference): all-to-all (P-1)/P of its input, all-gather (P-1)
times its part, reduce-scatter (P-1)/P of its input, all-reduce 2 (P-1)/P, a send the whole tensor."""

import contextlib

import pytest
import torch
import torch.distributed as dist

from opendit_lite.models import build_model
from opendit_lite.parallel import apply_dsp, make_sequence_parallel
from opendit_lite.parallel.comm_volume import SPWorkload, step_traffic
from tests.parallel.spawn import rank_checks
from tests.parallel.spawn import results as spawn_results

B, T, H, W, M = 2, 3, 6, 10, 8           # batch, latent frames, latent height/width (3 x 5 patches), caption
FRAME_TOKENS = (H // 2) * (W // 2)        # 15: not a multiple of 2 or 4


def _size(group) -> int:
    return dist.get_world_size(group)


@contextlib.contextmanager
def counting_sends():
    """Bytes this rank sends through torch.distributed while the block runs (``box[0]``)."""
    box = [0.0]
    real = {name: getattr(dist, name) for name in ("all_to_all_single", "all_gather_into_tensor",
                                                    "reduce_scatter_tensor", "all_reduce", "batch_isend_irecv")}

    def nbytes(t):
        return t.numel() * t.element_size()

    def all_to_all_single(out, inp, *args, group=None, **kw):
        box[0] += nbytes(inp) * (_size(group) - 1) / _size(group)
        return real["all_to_all_single"](out, inp, *args, group=group, **kw)

    def all_gather_into_tensor(out, inp, group=None, **kw):
        box[0] += nbytes(inp) * (_size(group) - 1)
        return real["all_gather_into_tensor"](out, inp, group=group, **kw)

    def reduce_scatter_tensor(out, inp, op=dist.ReduceOp.SUM, group=None, **kw):
        box[0] += nbytes(inp) * (_size(group) - 1) / _size(group)
        return real["reduce_scatter_tensor"](out, inp, op=op, group=group, **kw)

    def all_reduce(t, op=dist.ReduceOp.SUM, group=None, **kw):
        box[0] += 2 * nbytes(t) * (_size(group) - 1) / _size(group)
        return real["all_reduce"](t, op=op, group=group, **kw)

    def batch_isend_irecv(ops):
        box[0] += sum(nbytes(op.tensor) for op in ops if op.op is dist.isend)
        return real["batch_isend_irecv"](ops)

    fakes = dict(all_to_all_single=all_to_all_single, all_gather_into_tensor=all_gather_into_tensor,
                 reduce_scatter_tensor=reduce_scatter_tensor, all_reduce=all_reduce,
                 batch_isend_irecv=batch_isend_irecv)
    for name, fn in fakes.items():
        setattr(dist, name, fn)
    try:
        yield box
    finally:
        for name, fn in real.items():
            setattr(dist, name, fn)


# name -> (builder kwargs, the workload written from the model's config: the formulas' inputs)
MODELS = {
    "DiT-T/2": (dict(input_size=(H, W), num_classes=10),
                SPWorkload("DiT-T/2", tokens=FRAME_TOKENS, hidden=64, heads=(4,), layers=2)),
    "STDiT-tiny": ({}, SPWorkload("STDiT-tiny", tokens=FRAME_TOKENS, hidden=64, heads=(4,), layers=2, sequences=T,
                                  frames=T)),
    "Vchitect-tiny": ({}, SPWorkload("Vchitect-tiny", tokens=FRAME_TOKENS, hidden=64, heads=(4,), layers=2,
                                     sequences=T, text_tokens=M, text_query_layers=1)),
}
CASES = {
    2: [(m, mode, None) for m in MODELS for mode in ("ulysses", "ring")] + [("STDiT-tiny", "dsp", None)],
    # At 4 ranks: USP (2 x 2) for every model, the ring over 4 and DSP padding 3 frames to 4.
    4: [(m, "usp", 2) for m in MODELS] + [("DiT-T/2", "ring", None), ("STDiT-tiny", "dsp", None)],
}


def _step(name, model, backward=True):
    gen = torch.Generator().manual_seed(0)
    if name.startswith("DiT"):
        x = torch.randn(B, 4, H, W, generator=gen)
        out = model(x, torch.rand(B, generator=gen) * 999, torch.randint(0, 10, (B,), generator=gen))
    else:
        x = torch.randn(B, 4, T, H, W, generator=gen)
        mask = torch.ones(B, M, dtype=torch.bool)
        out = model(x, torch.rand(B, generator=gen) * 999, torch.randn(B, M, 32, generator=gen), mask)
    if backward:
        out.square().mean().backward()


def _counted(rank, world_size):
    counted = {}
    for name, mode, ring in CASES[world_size]:
        torch.manual_seed(0)
        model = build_model(name, **MODELS[name][0])
        if mode == "dsp":
            apply_dsp(model, dist.group.WORLD)
        else:
            make_sequence_parallel(model, dist.group.WORLD, mode, ring)
        with torch.no_grad():  # the first forward checks once that the SP ranks hold the same tokens
            _step(name, model, backward=False)
        with counting_sends() as sent:
            _step(name, model)
        counted[(name, mode, ring)] = sent[0]
    return counted


rank_checks("comm_volume", 2)(_counted)
rank_checks("comm_volume", 4)(_counted)


@pytest.mark.parametrize("world", [2, 4])
def test_formula_matches_bytes_sent_by_the_ops(world):
    per_rank = spawn_results("comm_volume", world)
    wrong = []
    for (name, mode, ring), sent in per_rank[0].items():
        predicted = step_traffic(MODELS[name][1], mode, world, ring, element_bytes=4, batch=B).total
        # Every rank of a group sends the same (padding travels too).
        assert all(r[(name, mode, ring)] == sent for r in per_rank), (name, mode, [r[(name, mode, ring)]
                                                                                  for r in per_rank])
        if predicted != pytest.approx(sent, rel=1e-9):
            wrong.append(f"{name} {mode} ring={ring}: formula {predicted:.0f} B, sent {sent:.0f} B")
    assert not wrong, "; ".join(wrong)
