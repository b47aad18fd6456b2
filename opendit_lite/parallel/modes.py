"""Which sequence-parallel mode runs, and with which Ulysses x ring split: the head rules of the three
attention-sharding modes, the guiding errors when a model's heads do not allow a mode, and the choice
``sp_mode: auto`` makes (the planner prints the same).

* ``ulysses``: heads are the unit of sharding, so ``sp_size`` must divide every self/joint attention
  module's head count.
* ``ring``: keys/values travel around the whole SP group; any ``sp_size`` (more ranks than heads too).
* ``usp``: Ulysses over ``U = sp_size / sp_ring_size`` consecutive ranks inside each of ``sp_ring_size``
  ring steps; ``U`` must divide the heads. ``sp_ring_size`` None takes the smallest ring the heads
  allow: ``U`` = the largest divisor of ``sp_size`` that divides every head count.

``auto`` (``decide_sp_mode``): among the modes the heads and the model allow (ulysses; dsp for a model with
``SequenceSwitch`` markers and frames; usp at every ring size whose Ulysses degree divides the heads; ring),
the one whose communication per layer, forward + backward, costs the least time that compute does not
hide. The bytes are ``comm_volume.py``'s; they are timed on ``Links``: all-to-alls and text collectives at
the link speed of their group (inside a node, or across nodes when the SP group spans nodes: a Ulysses
group of consecutive ranks stays in its node when it fits one), not overlapped; the ring's K/V and dK/dV
transfers overlapped with the attention of the block in hand (each step hides what its block's FLOPs
take), plus the ring's fp32 merges (about 64 bytes of memory traffic per element of a block per step).
Without the sequence length (``parallelize`` called without ``AutoInputs``) nothing is credited to
overlap and DSP is not considered. The planner prints the same choice and its reason.
"""

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from opendit_lite.errors import SequenceParallelError

from .comm_volume import SPWorkload, ceil_div, layer_traffic

ATTENTION_MODES = ("ulysses", "ring", "usp")


@dataclass(frozen=True)
class ModeChoice:
    """The mode that runs, its ring degree (1 for Ulysses, sp_size for ring) and why it was chosen."""

    mode: str
    ring_size: int
    reason: str = ""

    def describe(self, sp_size: int) -> str:
        if self.mode == "usp":
            return f"usp (ring {self.ring_size} x ulysses {sp_size // self.ring_size})"
        return self.mode


def _heads_gcd(heads: Dict[str, int]) -> int:
    return math.gcd(*heads.values()) if heads else 0


def largest_ulysses_degree(heads: Dict[str, int], sp_size: int) -> int:
    """The largest divisor of ``sp_size`` that divides every head count (``sp_size`` when no heads)."""
    g = _heads_gcd(heads)
    if not g:
        return sp_size
    return max(d for d in range(1, sp_size + 1) if sp_size % d == 0 and g % d == 0)


def ulysses_heads_error(num_heads: int, sp_size: int, where: str = "the attention") -> SequenceParallelError:
    """The error of Ulysses at a degree that does not divide the heads: it names ring and usp."""
    u = largest_ulysses_degree({where: num_heads}, sp_size)
    usp = (f", sp_mode=usp sp_ring_size={sp_size // u} (Ulysses over {u} ranks, which divides the heads, inside "
           f"rings of {sp_size // u})" if 1 < u < sp_size else "")
    return SequenceParallelError(
        f"Ulysses sequence parallelism shards attention heads over the sequence-parallel group, but {where} has "
        f"num_heads={num_heads}, not divisible by sp_size={sp_size}. Use sp_mode=ring (ring attention has no head "
        f"limit){usp}, sp_mode=auto (chooses for you), or an sp_size that divides {num_heads}.")


def usp_heads_error(num_heads: int, sp_size: int, ring_size: int,
                    where: str = "the attention") -> SequenceParallelError:
    u = largest_ulysses_degree({where: num_heads}, sp_size)
    return SequenceParallelError(
        f"USP shards heads over its Ulysses degree sp_size / sp_ring_size = {sp_size // ring_size}, which must divide "
        f"num_heads={num_heads} of {where}: use sp_ring_size={sp_size // u} (or any multiple of it that divides "
        f"sp_size={sp_size}), or sp_mode=ring, which has no head constraint.")


def choose_mode(requested: str, ring_size: Optional[int], heads: Dict[str, int], sp_size: int,
                supported: Sequence[str], auto: Optional["AutoInputs"] = None) -> ModeChoice:
    """The mode that runs for ``requested`` ("ulysses" | "ring" | "usp" | "auto") given the head counts
    of the modules whose heads are sharded (``heads``: module name -> heads) and the model's
    ``supported`` modes; ``auto``: what ``sp_mode=auto`` decides from besides the heads (None: nothing
    known). Raises ``SequenceParallelError`` (a ConfigError: exit code 2) with a way out
    when the heads do not allow the requested mode."""
    u_max = largest_ulysses_degree(heads, sp_size)
    g = _heads_gcd(heads)
    if requested == "ulysses":
        if g and g % sp_size:
            name = next(n for n, h in heads.items() if h % sp_size)
            raise ulysses_heads_error(heads[name], sp_size, name)
        return ModeChoice("ulysses", 1)
    if requested == "ring":
        return ModeChoice("ring", sp_size)
    if requested == "usp":
        if ring_size is None:
            ring_size = sp_size // u_max
            reason = (f"sp_ring_size unset: the smallest ring the heads allow (Ulysses over {u_max}, the largest "
                      f"divisor of sp_size={sp_size} dividing the heads)")
        else:
            reason = ""
        if ring_size < 1 or sp_size % ring_size:
            raise SequenceParallelError(f"sp_ring_size={ring_size} must divide sp_size={sp_size} (USP runs Ulysses "
                                        f"over sp_size / sp_ring_size ranks inside each ring step).")
        degree = sp_size // ring_size
        if g and g % degree:
            name = next(n for n, h in heads.items() if h % degree)
            raise usp_heads_error(heads[name], sp_size, ring_size, name)
        return ModeChoice("usp", ring_size, reason)
    if requested != "auto":
        raise SequenceParallelError(f"sp_mode={requested!r} is not a sequence-parallel attention mode; use one of "
                                    f"{', '.join(ATTENTION_MODES)} or auto.")
    auto = auto or AutoInputs()
    return decide_sp_mode(heads, sp_size, supported, auto.workload, auto.links, auto.spans_nodes)


# ----------------------------------------------------------------------------------------------
# sp_mode=auto: the mode whose communication costs the least time not hidden by compute
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Links:
    """What the auto choice times bytes with; the defaults are an 8-GPU H100-class node."""

    intra_node_gbps: float = 300.0    # GB/s one GPU sends to the others of its node (NVLink/NVSwitch)
    inter_node_gbps: float = 50.0     # GB/s one GPU sends across nodes (one 400 Gb/s NIC per GPU)
    ranks_per_node: int = 8
    attention_tflops: float = 400.0   # attention kernel throughput: what hides the ring's transfers
    memory_gbps: float = 3000.0       # device memory bandwidth: the ring's fp32 merges


@dataclass(frozen=True)
class AutoInputs:
    """What ``sp_mode: auto`` decides from besides the heads: the model's sequence-parallel workload
    (None: unknown), whether the SP group spans nodes, and the link speeds."""

    workload: Optional[SPWorkload] = None
    spans_nodes: bool = False
    links: Links = field(default_factory=Links)


AUTO_ELEMENT_BYTES = 2     # the choice times bf16 activations (what GPU training moves)
RING_MERGE_BYTES = 64      # fp32 memory traffic per block element per ring step (merges, dK/dV accumulators)
FLASH_BACKWARD = 2.5       # attention backward FLOPs / forward FLOPs


def mode_candidates(heads: Dict[str, int], sp_size: int, supported: Sequence[str],
                    workload: Optional[SPWorkload] = None) -> List[Tuple[str, Optional[int]]]:
    """(mode, ring size) pairs that can run, in the order ties are broken: ulysses, dsp, usp by growing
    ring, ring."""
    g = _heads_gcd(heads)
    out: List[Tuple[str, Optional[int]]] = []
    if "ulysses" in supported and (not g or g % sp_size == 0):
        out.append(("ulysses", None))
    if "dsp" in supported and workload is not None and workload.frames > 1:
        out.append(("dsp", None))
    if "usp" in supported:
        out += [("usp", r) for r in range(2, sp_size) if sp_size % r == 0 and (not g or g % (sp_size // r) == 0)]
    if "ring" in supported:
        out.append(("ring", None))
    return out


def exposed_seconds(w: SPWorkload, mode: str, ring_size: Optional[int], sp_size: int, links: Links,
                    spans_nodes: bool, overlap: bool = True) -> Tuple[float, str]:
    """Communication time per layer (forward + backward) that compute does not hide, and what moves."""
    P, e = sp_size, AUTO_ELEMENT_BYTES
    t = layer_traffic(w, mode, P, ring_size, e)
    ring = ring_size if mode == "usp" else (P if mode == "ring" else 1)
    ulysses = P // ring if mode != "dsp" else P
    intra, inter = links.intra_node_gbps * 1e9, links.inter_node_gbps * 1e9
    a2a_bw = inter if spans_nodes and (ulysses > links.ranks_per_node or mode == "dsp") else intra
    ring_bw = inter if spans_nodes else intra
    seconds = t.all_to_all / a2a_bw + t.collective / (ring_bw if ring > 1 else a2a_bw)
    what = [f"{t.all_to_all / 2 ** 20:.1f} MiB all-to-all"] if t.all_to_all else []
    if ring > 1:
        shard = w.sequences * ceil_div(w.tokens, P) * w.hidden                       # S: one tensor's shard
        block = ceil_div(w.tokens, P) * ulysses                                      # tokens of a ring block
        flops = 4 * w.sequences * block * block * (w.hidden / ulysses) if overlap else 0.0
        compute = flops / (links.attention_tflops * 1e12)
        fwd = 2 * shard * e / ring_bw                                                 # K, V
        bwd = (2 * shard * e + 2 * shard * 4) / ring_bw                               # K, V and fp32 dK, dV
        seconds += (ring - 1) * (max(0.0, fwd - compute) + max(0.0, bwd - FLASH_BACKWARD * compute))
        seconds += 2 * shard * 4 / ring_bw                                            # the last dK/dV hop
        seconds += ring * RING_MERGE_BYTES * shard / (links.memory_gbps * 1e9)
        what.append(f"{t.ring / 2 ** 20:.1f} MiB ring P2P")
    if t.collective:
        what.append(f"{t.collective / 2 ** 20:.2f} MiB text collectives")
    return seconds, ", ".join(what) or "nothing"


def _label(mode: str, ring_size: Optional[int], sp_size: int) -> str:
    return ModeChoice(mode, ring_size or 1).describe(sp_size) if mode == "usp" else mode


def decide_sp_mode(heads: Dict[str, int], sp_size: int, supported: Sequence[str],
                   workload: Optional[SPWorkload] = None, links: Optional[Links] = None,
                   spans_nodes: bool = False) -> ModeChoice:
    """The ``sp_mode: auto`` choice (see the module docstring) with a one-paragraph reason. ``heads``:
    module name -> head count of every self/joint attention; ``supported``: the model's modes (dsp
    among them for a multi-axis model); ``workload``: tokens, width and frames (None: unknown, nothing
    credited to overlap); ``spans_nodes``: the SP group crosses nodes."""
    links = links or Links()
    candidates = mode_candidates(heads, sp_size, supported, workload)
    g = _heads_gcd(heads)
    heads_text = f"the heads ({', '.join(sorted({str(h) for h in heads.values()}))})" if heads else \
        "no attention module shards heads"
    if not candidates:
        if "ulysses" in supported and heads:  # only Ulysses declared: say why it cannot run
            name = next(n for n, h in heads.items() if h % sp_size)
            raise ulysses_heads_error(heads[name], sp_size, name)
        raise SequenceParallelError(f"sp_mode=auto found none of {', '.join(ATTENTION_MODES)} in the model's "
                                    f"supported modes {tuple(supported)}.")
    if not g or g % sp_size == 0:
        rule = f"sp_size={sp_size} divides {heads_text}"
    elif any(m == "usp" for m, _ in candidates):
        rule = (f"sp_size={sp_size} does not divide {heads_text}: Ulysses runs over at most "
                f"{largest_ulysses_degree(heads, sp_size)} ranks, inside USP rings")
    else:
        rule = (f"no Ulysses degree above 1 divides both sp_size={sp_size} and {heads_text}: ring attention has no "
                f"head limit")
    known = workload is not None
    w = workload or SPWorkload("unknown", tokens=sp_size * 1024, hidden=1024, heads=tuple(heads.values()) or (1,))
    timed = [(exposed_seconds(w, m, r, sp_size, links, spans_nodes, overlap=known), m, r) for m, r in candidates]
    (best_seconds, _), mode, ring = min(timed, key=lambda x: x[0][0])   # min keeps the first of equals
    where = (f"across nodes ({links.inter_node_gbps:g} GB/s per GPU; {links.intra_node_gbps:g} GB/s inside a node)"
             if spans_nodes else f"inside one node ({links.intra_node_gbps:g} GB/s per GPU)")
    shape = (f"{w.tokens} tokens per sequence x {w.sequences} sequence(s), width {w.hidden}"
             + (f", {w.frames} frames" if w.frames else "") + (f", {w.text_tokens} text tokens" if w.text_tokens
                                                                else "")
             if known else "sequence length unknown here: timed for a nominal 1024 tokens per rank of width 1024, "
             "nothing credited to overlap")
    costs = "; ".join(f"{_label(m, r, sp_size)} {sec * 1e6:.3g} us ({what})" for (sec, what), m, r in timed)
    reason = (f"sp_mode=auto: {rule}; {shape}; {where}. Communication per layer (forward + backward) not hidden "
              f"by compute: {costs}. {_label(mode, ring, sp_size)} costs the least.")
    ring_size = ring if mode == "usp" else (sp_size if mode == "ring" else 1)
    return ModeChoice(mode, ring_size, reason)
