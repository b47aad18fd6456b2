"""The vocabulary of a diffusers family's sequence-parallel spec: where the image tokens are split and
gathered, and what each attention module attends over.

A spec is declared per diffusers class (``opendit_lite/families/<family>/sp_spec.py``), never guessed
from the model: the split points and roles follow the class's forward code, which the spec's
comments point to. Module paths are
dotted names under the model, ``*`` matching one path atom (``blocks.*.attn1``) and ``""`` the model.
"""

import fnmatch
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple, Union

import torch.nn as nn

ROLES = ("self", "joint", "cross", "serial")


@dataclass(frozen=True)
class Split:
    """Shard one tensor along ``dim`` (padded to a multiple of the SP size).

    ``ndim``: the rank the plan expects (another rank is an error naming the module, unless ``optional``:
    then the tensor is left whole, e.g. Wan's per-token timestep exists only for Wan 2.2 TI2V)."""

    dim: int
    ndim: Optional[int] = None
    optional: bool = False


@dataclass(frozen=True)
class Gather:
    """All-gather a module's output along ``dim`` and drop the split's padding."""

    dim: int
    ndim: Optional[int] = None


# A split point: forward argument name (an input, split before the module runs) or output index (split
# after it ran) -> Split, or a tuple of Splits for a tuple argument (e.g. rotary (cos, sin)).
SplitEntry = Union[Split, Tuple[Split, ...]]


@dataclass(frozen=True)
class SplitAt:
    """Tensors split at one module: ``inputs`` by forward argument name, ``outputs`` by output index."""

    where: str
    inputs: Dict[str, SplitEntry] = field(default_factory=dict)
    outputs: Dict[int, SplitEntry] = field(default_factory=dict)


@dataclass(frozen=True)
class AttentionSpec:
    """The attention modules matching ``pattern`` and what they attend over.

    ``role``: "self" (the image tokens), "joint" (text replicated + image shard, ``text`` "first" or
    "last" in the serial concatenation), "cross" (queries from the image shard, keys/values from the
    replicated text: local) or "serial" (text only: left as it is). ``processors``: the diffusers
    processor classes whose SDPA call sequence parallelism intercepts; any other processor (IP-adapter,
    custom) is refused by name. ``query_mask``: the processor masks queries as well as keys
    (``valid[i] & valid[j]``, HunyuanVideo 1.5); the masked queries are text tokens whose outputs no
    output reads (attended by nothing after), so the attention runs with the key mask alone."""

    pattern: str
    role: str
    processors: Tuple[str, ...]
    text: Optional[str] = None
    query_mask: bool = False

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"attention role {self.role!r}; expected one of {ROLES}")
        if (self.role == "joint") != (self.text in ("first", "last")):
            raise ValueError(f"{self.pattern}: joint attention needs text='first' or 'last' (and only joint does)")


@dataclass(frozen=True)
class FamilySpec:
    """Sequence parallelism of one diffusers transformer class (see the module docstring)."""

    family: str                                   # "wan", "flux", ...
    cls_name: str                                 # the diffusers class it is declared for
    splits: Tuple[SplitAt, ...]
    gathers: Dict[str, Gather]
    attention: Tuple[AttentionSpec, ...]
    supported_sp_modes: Tuple[str, ...] = ("ulysses", "ring", "usp")
    unsupported: Callable[[nn.Module], Optional[str]] = field(default=lambda model: None)
    why_not_diffusers_cp: str = ""                # why diffusers' own context parallelism is not used


def matches(name: str, pattern: str) -> bool:
    """Whether module path ``name`` matches ``pattern`` ('*' matches one path atom, '' the model)."""
    a, p = (name.split(".") if name else []), (pattern.split(".") if pattern else [])
    return len(a) == len(p) and all(fnmatch.fnmatchcase(x, y) for x, y in zip(a, p))


def find_modules(model: nn.Module, pattern: str):
    """(name, module) pairs of ``model`` matching ``pattern``, in module order."""
    return [(name, m) for name, m in model.named_modules() if matches(name, pattern)]
