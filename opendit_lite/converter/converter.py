"""``ModuleConverter``: apply the registered conversions to a model in place and report them.

    report = ModuleConverter(fused_adaln=True, attention_backend="auto").convert(model)
    print(report)

For each conversion, in the registry's order (see ``registry.py``), whose ``enabled(options)`` is
true, every submodule that matches its source type is handed to its factory and the result is put
in its place on the parent module; a factory that instead changes the module in place (swaps one
of its direct children, e.g. wraps ``attn_op``, or rebinds its class's forward) has those children
and the class change reported. Conversions registered under one name report as one section. The root module is
never replaced. A matched module's own
children are not searched by the same conversion (the factory owns that subtree), but the next
conversion sees the model as this one left it, so a later wrapper finds an earlier replacement.
A module reachable under several names is converted once and the replacement shared the same way.
"""

import dataclasses
from collections import Counter
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import torch.nn as nn

from ..config.access import config_get
from .registry import CONVERSIONS, Conversion, ConversionRegistry, ConverterOptions


class Replacement(NamedTuple):
    """One replaced submodule: its qualified name in the model and the types before and after."""

    qualified_name: str
    old_type: type
    new_type: type


@dataclasses.dataclass
class ConversionSection:
    """What one conversion did: whether it was on, its note and the modules it replaced."""

    name: str
    enabled: bool
    note: Optional[str] = None
    replaced: List[Replacement] = dataclasses.field(default_factory=list)

    def summary(self) -> str:
        parts = [f"{self.name}: {'on' if self.enabled else 'off'}"]
        if self.note:
            parts.append(self.note)
        if self.enabled:
            pairs = Counter((r.old_type.__name__, r.new_type.__name__) for r in self.replaced)
            parts += [f"{count} x {old} -> {new}" for (old, new), count in pairs.items()] or ["nothing to replace"]
        return "; ".join(parts)


@dataclasses.dataclass
class ConversionReport:
    """The sections of one ``convert`` call, in the order the conversions ran."""

    sections: List[ConversionSection] = dataclasses.field(default_factory=list)

    @property
    def replaced(self) -> List[Replacement]:
        """Every replacement, as (qualified_name, old_type, new_type), in the order made."""
        return [r for section in self.sections for r in section.replaced]

    def counts(self) -> Dict[str, int]:
        """Modules replaced per conversion name."""
        return {section.name: len(section.replaced) for section in self.sections}

    def __str__(self) -> str:
        on = sum(section.enabled for section in self.sections)
        lines = [f"module converter: {on} of {len(self.sections)} conversions on, "
                 f"{len(self.replaced)} modules replaced"]
        seen = set()
        for section in self.sections:  # one line per distinct summary (a conversion may cover several types)
            summary = section.summary()
            if summary not in seen:
                seen.add(summary)
                lines.append(f"  {summary}")
        return "\n".join(lines)


class ModuleConverter:
    """Swap model submodules for faster backends, as asked by keyword.

    Args:
        config: optional, for configs written for it before the keywords existed (a TrainConfig,
            an EasyDict, a mapping): its ``fused_adaln``, ``fused_layernorm`` and
            ``attention_backend`` fill the keywords not given. None: everything off, SDPA.
        registry: the conversions to apply (default: the module-level ``CONVERSIONS``).
        fused_adaln, fused_layernorm, attention_backend: see ``ConverterOptions``.
        **context: runtime objects handed to every factory as a dict.
    """

    def __init__(self, config: Any = None, registry: Optional[ConversionRegistry] = None, *,
                 fused_adaln: Optional[bool] = None, fused_layernorm: Optional[bool] = None,
                 attention_backend: Optional[str] = None, **context: Any):
        given = dict(fused_adaln=fused_adaln, fused_layernorm=fused_layernorm, attention_backend=attention_backend)
        self.options = ConverterOptions(**{key: config_get(config, key) if value is None else value
                                           for key, value in given.items()})
        self.registry = registry if registry is not None else CONVERSIONS
        self.context: Dict[str, Any] = context

    def convert(self, model: nn.Module) -> ConversionReport:
        """Replace matching submodules of ``model`` in place; returns what was done."""
        report = ConversionReport()
        by_name: Dict[str, ConversionSection] = {}
        for conversion in self.registry.ordered():
            enabled = bool(conversion.enabled(self.options))
            note = conversion.describe(self.options) if conversion.describe is not None else None
            replaced = self._apply(conversion, model) if enabled else []
            # One section per name: a name registered for several types (the zoo's module and
            # foreign blocks for fused_adaln, adapters and ops for attention_backend) is one swap.
            section = by_name.get(conversion.name)
            if section is None:
                section = by_name[conversion.name] = ConversionSection(conversion.name, enabled, note)
                report.sections.append(section)
            else:
                section.note = (note if enabled and not section.enabled else section.note) or note
                section.enabled = section.enabled or enabled
            section.replaced += replaced
        return report

    def _apply(self, conversion: Conversion, model: nn.Module) -> List[Replacement]:
        done: Dict[int, nn.Module] = {}  # id(old module) -> its replacement, for shared modules
        replaced: List[Replacement] = []
        for qualified_name, parent, attr, module in _matching_children(model, conversion):
            if id(module) in done:
                new = done[id(module)]
            else:
                type_before = type(module)
                # Children, and plain attributes that may become children (a diffusers attention
                # processor set as an nn.Module), to report what an in-place factory swapped.
                attributes_before = {**vars(module), **module._modules}
                new = conversion.factory(module, self.options, self.context)
                if not isinstance(new, nn.Module):
                    raise TypeError(
                        f"conversion {conversion.name!r} returned {type(new).__name__} for {qualified_name!r}; "
                        f"a factory must return an nn.Module (the module itself to leave it in place)"
                    )
                new.train(module.training)
                done[id(module)] = new
                if new is module:  # converted in place, if at all: report what it swapped
                    if type(module) is not type_before:  # its forward rebound (see class_swap.py)
                        replaced.append(Replacement(qualified_name, type_before, type(module)))
                    replaced += [
                        Replacement(f"{qualified_name}.{name}", type(attributes_before.get(name)), type(child))
                        for name, child in module._modules.items()
                        if attributes_before.get(name) is not None and child is not attributes_before[name]
                    ]  # a child added where nothing was (an attn_op for a rebound forward) is not a swap
            if new is not module:
                setattr(parent, attr, new)
                replaced.append(Replacement(qualified_name, type(module), type(new)))
        return replaced


def _matching_children(root: nn.Module, conversion: Conversion) -> List[Tuple[str, nn.Module, str, nn.Module]]:
    """(qualified name, parent, attribute, module) for each match below ``root``, collected before
    any replacement; the subtree of a match is not searched."""
    found = []
    visited = set()

    def visit(parent: nn.Module, prefix: str) -> None:
        if id(parent) in visited:  # a shared subtree: its children are listed the first time
            return
        visited.add(id(parent))
        # _modules rather than named_children(): the latter lists a module held under two
        # attributes of the same parent only once, and both attributes need the replacement.
        for attr, child in list(parent._modules.items()):
            if child is None:
                continue
            qualified_name = f"{prefix}{attr}"
            if conversion.matches(child):
                found.append((qualified_name, parent, attr, child))
            else:
                visit(child, qualified_name + ".")

    visit(root, "")
    return found
