"""The parts of the Gemini strategy that run without a GPU: which slice of each parameter's fp32 master
chunk a rank holds (against a reference written here), and the forward pre-hook that hands a
module its fp32 inputs back after a wrapper's cast. The whole of it runs in test_gemini_resume_gpu.py."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from opendit_lite.plugins import gemini
from opendit_lite.plugins.fp32_inputs import kept_arguments, with_arguments


class Timed(nn.Module):
    fp32_inputs = ("t",)

    def forward(self, x, t, y=None):
        return x, t, y


def test_kept_arguments_and_with_arguments():
    m = Timed()
    x, t = torch.randn(2), torch.tensor([999.37, 1.5])
    assert kept_arguments(m, (x,), dict(t=t)) == {"t": t}
    assert kept_arguments(nn.Identity(), (x,), {}) == {}
    args, kwargs = with_arguments(m, (x, t.bfloat16()), {}, {"t": t}, lambda v: "cast")
    assert args == ("cast", t) and kwargs == {}


def test_kept_inputs_hook_undoes_a_wrappers_cast():
    """A wrapper casting every input (as GeminiDDP does) and the module still receiving fp32 timesteps."""
    m = Timed()
    kept = gemini._KeptInputs()
    m.register_forward_pre_hook(kept.restore, with_kwargs=True)
    x, t = torch.randn(2), torch.tensor([999.37, 1.5])

    def wrapper(*args, **kwargs):  # what GeminiDDP.forward does around the module call
        with kept.holding(kept_arguments(m, args, kwargs)):
            return m(*[a.bfloat16() for a in args], **{k: v.bfloat16() for k, v in kwargs.items()})

    out_x, out_t, _ = wrapper(x, t)
    assert out_x.dtype == torch.bfloat16 and out_t.dtype == torch.float32 and torch.equal(out_t, t)
    _, out_t, _ = wrapper(x, t=t)
    assert torch.equal(out_t, t)
    assert m(x, t.bfloat16())[1].dtype == torch.bfloat16  # outside the wrapper the hook does nothing


def _fake_gemini(params, chunk_size, shard_size, rank, keep_gathered):
    """A stand-in for GeminiDDP: one chunk holding ``params`` end to end, its fp32 pair's payload being
    this rank's shard (or the whole chunk when kept gathered), filled with the chunk index."""
    offsets, total = {}, 0
    for p in params:
        offsets[p] = SimpleNamespace(offset=total, end=total + p.numel())
        total += p.numel()
    payload = torch.arange(chunk_size, dtype=torch.float32)
    if not keep_gathered:
        payload = payload[rank * shard_size:(rank + 1) * shard_size].clone()
    chunk = SimpleNamespace(tensors_info=offsets, keep_gathered=keep_gathered, shard_begin=rank * shard_size,
                            shard_size=shard_size, paired_chunk=SimpleNamespace(payload=payload))
    module = nn.Module()
    for i, p in enumerate(params):
        module.register_parameter(f"p{i}", p)
    return SimpleNamespace(chunk_manager=SimpleNamespace(get_chunk=lambda p: chunk), unwrap=lambda: module)


def test_master_slices_follow_the_chunk_shards():
    params = [nn.Parameter(torch.zeros(3, 2)), nn.Parameter(torch.zeros(5)), nn.Parameter(torch.zeros(4))]
    # the chunk: [p0: 0..6) [p1: 6..11) [p2: 11..15) padding to 16, in 2 shards of 8
    for rank, expected in ((0, {"p0": range(0, 6), "p1": range(6, 8)}),
                           (1, {"p1": range(8, 11), "p2": range(11, 15)})):
        model = _fake_gemini(params, 16, 8, rank, keep_gathered=False)
        got = gemini.master_shards(model)
        assert {k: v.tolist() for k, v in got.items()} == {k: [float(i) for i in r] for k, r in expected.items()}
    whole = gemini.master_shards(_fake_gemini(params, 16, 8, 1, keep_gathered=True))
    assert {k: v.numel() for k, v in whole.items()} == {"p0": 6, "p1": 5, "p2": 4}


def test_load_master_shards_copies_and_checks():
    params = [nn.Parameter(torch.zeros(3, 2)), nn.Parameter(torch.zeros(5))]
    model = _fake_gemini(params, 12, 6, 1, keep_gathered=False)  # rank 1 holds p1[0:5] at payload[0:5]
    gemini.load_master_shards(model, {"p1": torch.full((5,), 7.0)})
    assert model.chunk_manager.get_chunk(None).paired_chunk.payload[:5].tolist() == [7.0] * 5
    with pytest.raises(ValueError, match="p1.*another world size"):
        gemini.load_master_shards(model, {"p1": torch.zeros(4)})
    with pytest.raises(KeyError, match="p1"):
        gemini.load_master_shards(model, {})
