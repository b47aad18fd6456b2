"""parallelize() with a 2-rank gloo sequence-parallel group: a model whose attention nothing knows
is a clear error naming its attention class and how to register it; a mode the model does not
declare is refused; STDiT runs Ulysses (temporal attention kept serial) and DSP; sp_mode=auto says
what it chose and why; Ulysses at heads it cannot split is a config error naming ring and usp."""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from opendit_lite.models import build_model
from tests.parallel.outcome import error_message
from tests.parallel.spawn import rank_checks
from tests.parallel.spawn import results as spawn_results


class MyAttention(nn.Module):
    """Self-attention written straight on SDPA, with no ``attn_op`` for sequence parallelism to wrap."""

    def __init__(self, dim: int = 8, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):                                                     # x [B, N, D]
        B, N, D = x.shape
        q, k, v = self.qkv(x).view(B, N, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, D))


class MyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([MyAttention(), MyAttention()])

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x


def _unwrapped(report) -> str:
    """The report's rows as whole lines (``str(report)`` wraps long cells within their columns)."""
    return "\n".join(f"{row.step}  {row.swapped}  {row.count}  {row.left}" for row in report.rows)

def _stdit():
    torch.manual_seed(0)
    return build_model("STDiT-tiny", in_channels=3, caption_channels=8, model_max_length=4)


@rank_checks("parallelize", world_size=2)
def _rank_world2(rank, world_size):
    from opendit_lite.parallelization import parallelize

    group = dist.group.WORLD
    model = MyModel()
    out = {"unknown": error_message(lambda: parallelize(model, sp_group=group)),
           "dit_dsp": error_message(lambda: parallelize(build_model("DiT-T/2", input_size=8, num_classes=10),
                                                 sp_group=group, sp_mode="dsp"))}
    out["unknown_untouched"] = all(type(b) is MyAttention for b in model.blocks)
    ulysses = parallelize(_stdit(), sp_group=group, sp_mode="ulysses")
    dsp = parallelize(_stdit(), sp_group=group, sp_mode="dsp")
    out["ulysses"] = (ulysses.count("sequence_parallel"), str(ulysses))
    out["dsp"] = (dsp.count("sequence_parallel"), str(dsp))
    out["auto_4_heads"] = _unwrapped(parallelize(_dit(4), sp_group=group, sp_mode="auto"))
    out["auto_3_heads"] = _unwrapped(parallelize(_dit(3), sp_group=group, sp_mode="auto"))
    out["ulysses_3_heads"] = error_message(lambda: parallelize(_dit(3), sp_group=group, sp_mode="ulysses"))
    out["ring_size_without_usp"] = error_message(lambda: parallelize(_dit(4), sp_group=group, sp_mode="ring",
                                                              sp_ring_size=2))
    return out


def _dit(num_heads: int):
    from opendit_lite.models.dit import DiT

    return DiT(input_size=8, depth=2, hidden_size=16 * num_heads, num_heads=num_heads, num_classes=10)


def results():
    return spawn_results("parallelize", 2)


def test_unknown_attention_is_a_clearerror_message():
    for r in results():
        message = r["unknown"]
        assert message.startswith("SequenceParallelError: Sequence parallelism over 2 ranks"), message
        assert "block 0 (MyAttention) has no attention module" in message and "attn_op" in message
        assert "SequenceSplit" not in message and "sp_size=1" in message  # markers are not needed here
        assert message.count("attn_op") <= 2 and len(message) < 900, message  # one piece of advice, once
        assert r["unknown_untouched"]


def test_undeclared_mode_is_refused():
    message = results()[0]["dit_dsp"]
    assert message.startswith("ConfigError: sp_mode=dsp is not supported by DiT"), message
    assert "supported_sp_modes=('ulysses', 'ring', 'usp')" in message


def test_auto_reports_its_choice_and_ulysses_names_the_way_out():
    r = results()[0]
    assert "ulysses over 2 ranks" in r["auto_4_heads"]
    assert "sp_mode=auto: sp_size=2 divides the heads (4)" in r["auto_4_heads"]
    assert "ulysses costs the least" in r["auto_4_heads"]
    assert "ring over 2 ranks: " in r["auto_3_heads"] and "RingAttentionOp x2" in r["auto_3_heads"]
    assert "no Ulysses degree above 1 divides both sp_size=2 and the heads (3)" in r["auto_3_heads"]
    message = r["ulysses_3_heads"]
    assert message.startswith("SequenceParallelError: Ulysses sequence parallelism shards attention heads"), message
    assert "num_heads=3, not divisible by sp_size=2" in message and "sp_mode=ring" in message, message
    assert r["ring_size_without_usp"].startswith("ConfigError: sp_ring_size=2 sets the ring degree of sp_mode=usp")


def test_stdit_ulysses_and_dsp_report():
    r = results()[0]
    count, text = r["ulysses"]
    assert count > 0 and "ulysses over 2 ranks" in text and "UlyssesAttentionOp" in text
    assert "serial attention: TemporalAttention" in text
    count, text = r["dsp"]
    assert count > 0 and "dsp over 2 ranks" in text and "DSPSwitch" in text
