"""Bytes each rank sends for sequence parallelism, per layer and per training step (forward + backward),
for every mode: the formulas of the ops in ``ulysses.py``, ``usp.py`` (ring and USP), ``ring.py`` and
``dsp.py``. ``sp_mode: auto`` (``modes.py``), the planner and ``benchmarks/sp_comm_volume.py`` read them;
``tests/parallel/test_comm_volume.py`` checks them against the bytes the real ops hand to the
collectives on gloo.

What a collective "sends" per rank (the bandwidth-optimal algorithms; P ranks in its group, ``X`` the
bytes of the tensor a rank passes in):

    all-to-all      X (P - 1) / P        (the block for itself stays)
    all-gather      X (P - 1)            (X: this rank's part)
    reduce-scatter  X (P - 1) / P        (X: the full input)
    all-reduce      2 X (P - 1) / P
    P2P send        X

One layer's attention call, per sample: ``B`` sequences (1, or the frames T of a model whose
sequence-parallel attention runs per frame), ``N`` tokens per sequence along the sharded axis, width
``D``, ``H`` heads, P ranks, ``n = ceil(N / P)`` tokens per rank (the split pads), ``S = B n D`` elements
(one tensor's shard), ``e`` bytes per element, ``a = 4`` bytes per fp32 accumulator element. USP runs
Ulysses over ``U = P / R`` ranks inside rings of ``R`` (Ulysses: R = 1; ring: R = P):

    Ulysses part    8 S (U - 1) / U  e      q, k, v in one all-to-all and the output back, forward and
                                            the reverse in backward
    ring part       4 (R - 1) S e           K and V to the next rank at R - 1 steps, forward and again
                    + 2 R S a               in backward, plus the fp32 dK/dV accumulator, which travels
                                            one hop at each of the R backward steps
    DSP             4 B' Tp s D (P - 1) / P e   two all-to-alls of the hidden states per block (to whole
                                            frames before spatial attention, to whole frame sequences
                                            after it) and their reverses; B' samples, Tp the frames
                                            padded to a multiple of P, s = ceil(S_frame / P); no
                                            attention op communicates

Joint attention (text first, ``M`` text tokens replicated on every rank, text queries too) adds, for a
layer whose text queries attend: Ulysses (U > 1): the text output all-gathered over heads and its
gradient reduce-scattered, ``2 B M D (U - 1) / U e``; ring (R > 1): every rank's partial text output and
log-sum-exp all-gathered, ``(R - 1) B M (D + H) / U a``, and the output gradient all-reduced in backward,
``2 (R - 1) / R B M D / U a``. Cross-attention to a replicated context moves nothing.

Per step: the layers' sum plus the boundary: the last block's output all-gathered (``(P - 1) B n D e``)
and its gradient reduce-scattered (the same again). Attention masks over the whole sequence add an
all-gather of the mask (not counted here; the zoo's models pass none or key masks kept local).
"""

from dataclasses import dataclass
from typing import Optional, Tuple

ACC_BYTES = 4  # the ring's online-softmax and dK/dV accumulators are fp32


@dataclass(frozen=True)
class SPWorkload:
    """One model's sequence-parallel attention per sample, as the formulas need it.

    ``tokens``: N, tokens of one attention sequence along the sharded axis; ``sequences``: attention
    sequences per sample (the frames of a model whose attention runs per frame, else 1); ``heads``:
    the head counts of every self/joint attention module (Ulysses must divide all); ``text_tokens``: M
    of joint attention (0: none); ``text_query_layers``: layers whose text also queries (None: all);
    ``frames``: T of a model that can switch its sharded axis (DSP: ``tokens`` are then the tokens of one
    frame), else 0."""

    name: str
    tokens: int
    hidden: int
    heads: Tuple[int, ...]
    layers: int = 1
    sequences: int = 1
    text_tokens: int = 0
    text_query_layers: Optional[int] = None
    frames: int = 0

    @property
    def head_count(self) -> int:
        return self.heads[0] if self.heads else 1


@dataclass
class Traffic:
    """Bytes one rank sends, split by how they travel (the auto choice times them differently):
    ``all_to_all`` (Ulysses/DSP, not overlapped), ``ring`` (P2P, overlapped with the block compute),
    ``collective`` (joint text gathers and reductions, not overlapped); ``ring_steps``: R."""

    all_to_all: float = 0.0
    ring: float = 0.0
    collective: float = 0.0
    ring_steps: int = 1

    @property
    def total(self) -> float:
        return self.all_to_all + self.ring + self.collective

    def __add__(self, other: "Traffic") -> "Traffic":
        return Traffic(self.all_to_all + other.all_to_all, self.ring + other.ring,
                       self.collective + other.collective, max(self.ring_steps, other.ring_steps))

    def scaled(self, k: float) -> "Traffic":
        return Traffic(self.all_to_all * k, self.ring * k, self.collective * k, self.ring_steps)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def split_degrees(mode: str, sp_size: int, ring_size: Optional[int] = None) -> Tuple[int, int]:
    """(U, R): the Ulysses and ring degrees of ``mode`` over ``sp_size`` ranks."""
    if mode == "ulysses":
        return sp_size, 1
    if mode == "ring":
        return 1, sp_size
    if mode == "usp":
        if not ring_size or sp_size % ring_size:
            raise ValueError(f"usp needs a ring size dividing sp_size={sp_size}, got {ring_size}")
        return sp_size // ring_size, ring_size
    raise ValueError(f"no Ulysses/ring split for sp_mode={mode!r}")


def layer_traffic(w: SPWorkload, mode: str, sp_size: int, ring_size: Optional[int] = None, element_bytes: int = 2,
                  batch: int = 1, text_queries: bool = True) -> Traffic:
    """Bytes one rank sends in one layer (forward + backward) of ``batch`` samples."""
    P, e, a, D = sp_size, element_bytes, ACC_BYTES, w.hidden
    if P == 1:
        return Traffic()
    if mode == "dsp":
        if not w.frames:
            raise ValueError(f"{w.name} has no frame axis to switch: DSP does not apply")
        volume = 4 * batch * ceil_div(w.frames, P) * P * ceil_div(w.tokens, P) * D * (P - 1) / P * e
        return Traffic(all_to_all=volume)
    U, R = split_degrees(mode, P, ring_size)
    B = batch * w.sequences
    S = B * ceil_div(w.tokens, P) * D                      # one tensor's shard, elements
    t = Traffic(ring_steps=R)
    if U > 1:
        t.all_to_all = 8 * S * (U - 1) / U * e
    if R > 1:
        t.ring = 4 * (R - 1) * S * e + 2 * R * S * a
    M = w.text_tokens if text_queries else 0
    if M:
        if R > 1:
            t.collective += (R - 1) * B * M * (D + w.head_count) / U * a + 2 * (R - 1) / R * B * M * D / U * a
        if U > 1:
            t.collective += 2 * B * M * D * (U - 1) / U * e
    return t


def boundary_bytes(w: SPWorkload, sp_size: int, element_bytes: int = 2, batch: int = 1) -> float:
    """The gather after the last block and its reduce-scatter in backward."""
    P = sp_size
    if P == 1:
        return 0.0
    return 2 * (P - 1) * batch * w.sequences * ceil_div(w.tokens, P) * w.hidden * element_bytes


def step_traffic(w: SPWorkload, mode: str, sp_size: int, ring_size: Optional[int] = None, element_bytes: int = 2,
                 batch: int = 1) -> Traffic:
    """Bytes one rank sends in one training step (every layer plus the boundary), ``batch`` samples."""
    with_text = w.layers if w.text_query_layers is None else w.text_query_layers
    t = layer_traffic(w, mode, sp_size, ring_size, element_bytes, batch).scaled(with_text)
    if w.layers > with_text:
        t = t + layer_traffic(w, mode, sp_size, ring_size, element_bytes, batch, text_queries=False).scaled(
            w.layers - with_text)
    t.collective += boundary_bytes(w, sp_size, element_bytes, batch)
    return t


__all__ = ["ACC_BYTES", "SPWorkload", "Traffic", "boundary_bytes", "layer_traffic", "split_degrees", "step_traffic"]
