"""Which sequence-parallel mode runs, and with which Ulysses x ring split: the head rules of the three
attention-sharding modes, the guiding errors when a model's heads do not allow a mode, and the rule
``sp_mode: auto`` follows until the planner chooses by communication volume.

* ``ulysses``: heads are the unit of sharding, so ``sp_size`` must divide every self/joint attention
  module's head count.
* ``ring``: keys/values travel around the whole SP group; any ``sp_size`` (more ranks than heads too).
* ``usp``: Ulysses over ``U = sp_size / sp_ring_size`` consecutive ranks inside each of ``sp_ring_size``
  ring steps; ``U`` must divide the heads. ``sp_ring_size`` None takes the smallest ring the heads
  allow: ``U`` = the largest divisor of ``sp_size`` that divides every head count.

``auto``: Ulysses when ``sp_size`` divides the heads (fewest bytes, nothing to hide), else USP with that
largest Ulysses degree, else (no degree above 1 divides both) the plain ring; the choice and the
reason are printed in the ``parallelize`` report.
"""

import math
from dataclasses import dataclass
from typing import Dict, Optional, Sequence

from opendit_lite.errors import SequenceParallelError

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
                supported: Sequence[str]) -> ModeChoice:
    """The mode that runs for ``requested`` ("ulysses" | "ring" | "usp" | "auto") given the head counts
    of the modules whose heads are sharded (``heads``: module name -> heads) and the model's
    ``supported`` modes. Raises ``SequenceParallelError`` (a ConfigError: exit code 2) with a way out
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
    heads_text = f"the heads ({', '.join(sorted({str(h) for h in heads.values()}))})" if heads else \
        "no attention module shards heads"
    if "ulysses" in supported and u_max == sp_size:
        return ModeChoice("ulysses", 1, f"sp_mode=auto: sp_size={sp_size} divides {heads_text}, so Ulysses (the "
                                        f"fewest bytes moved, nothing to hide)")
    if "usp" in supported and u_max > 1:
        return ModeChoice("usp", sp_size // u_max,
                          f"sp_mode=auto: sp_size={sp_size} does not divide {heads_text}; USP with Ulysses over "
                          f"{u_max} ranks (the largest degree dividing both) inside rings of {sp_size // u_max}")
    if "ring" in supported:
        return ModeChoice("ring", sp_size, f"sp_mode=auto: no Ulysses degree above 1 divides both sp_size={sp_size} "
                                           f"and {heads_text}; ring attention has no head limit")
    if "ulysses" in supported:  # only Ulysses declared: say why it cannot run
        name = next(n for n, h in heads.items() if h % sp_size)
        raise ulysses_heads_error(heads[name], sp_size, name)
    raise SequenceParallelError(f"sp_mode=auto found none of {', '.join(ATTENTION_MODES)} in the model's supported "
                                f"modes {tuple(supported)}.")
