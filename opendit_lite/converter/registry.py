"""The conversion registry: which module types the converter replaces, by what, and when.

A conversion maps a source module TYPE to a factory::

    factory(module, options, context) -> nn.Module

``module`` is the instance found in the model, ``options`` the ``ConverterOptions`` of the
``ModuleConverter`` (which backends were asked for), ``context`` the dict of runtime objects given
to it as keyword arguments (factories may also keep state shared by one converter's calls there).
The factory returns the replacement, which may wrap ``module``, or ``module`` itself: unchanged,
or changed in place, in which case the direct children it swapped are reported. It must keep the
parameters (share the same ``nn.Parameter`` objects) and state-dict keys.

``enabled(options) -> bool`` switches the conversion on, and ``describe(options) -> str``
(optional) gives one line for the report saying what was chosen and why, e.g.
"attention: sdpa (flash-attn not installed)".

``when(module) -> bool`` (optional) narrows a match beyond the type: conversions for modules of
another project (Meta's DiT, diffusers) register ``nn.Module`` with ``include_subclasses=True`` and
a ``when`` that recognises the module by its declared structure or by its exact class looked up in
an already imported library, so that library is never imported just to register the conversion.

Order: conversions run one after the other, by ascending ``priority`` and, within a priority, in
registration order; each one sees the model as the previous ones left it. Adapters that give a
foreign module the zoo's interfaces (an ``attn_op`` child) use ``PRIORITY_ADAPTER`` (-100), so the
backend swaps that follow see their ops. Backend swaps use ``PRIORITY_BACKEND`` (0); a conversion
that wraps whatever backend is in place uses ``PRIORITY_WRAPPER`` (100), so it wraps the final
backend rather than one about to be replaced. Sequence parallelism is not a conversion:
``opendit_lite.parallelization.parallelize`` applies it after the converter, with
``opendit_lite.parallel``.

Registering with the default registry is one call::

    register_conversion(MyNorm, lambda m, options, ctx: MyFastNorm.from_module(m),
                        name="my_fast_norm", enabled=lambda options: options.fused_layernorm)

This module has no side effects on import, so other packages can register their conversions from
their own modules. The built-in conversions live in ``builtin.py``.
"""

import dataclasses
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch.nn as nn

PRIORITY_ADAPTER = -100
PRIORITY_BACKEND = 0
PRIORITY_WRAPPER = 100


@dataclasses.dataclass(frozen=True)
class ConverterOptions:
    """The backend swaps asked of a ``ModuleConverter``; what ``enabled``/``describe``/factories see."""

    fused_adaln: bool = False          # LayerNormModulate -> FusedLayerNormModulate (Triton)
    fused_layernorm: bool = False      # affine nn.LayerNorm -> apex FusedLayerNorm / Triton LayerNorm
    attention_backend: str = "sdpa"    # "sdpa" | "flash" | "auto" (flash when flash-attn imports)


Factory = Callable[[nn.Module, ConverterOptions, Dict[str, Any]], nn.Module]


def _always(options: ConverterOptions) -> bool:
    return True


@dataclasses.dataclass(frozen=True)
class Conversion:
    """One registered conversion (see the module docstring for the contract of each field)."""

    name: str
    source_type: type
    factory: Factory
    enabled: Callable[[ConverterOptions], bool] = _always
    describe: Optional[Callable[[ConverterOptions], str]] = None
    priority: int = PRIORITY_BACKEND
    include_subclasses: bool = False  # match subclasses of source_type too, not only the exact type
    when: Optional[Callable[[nn.Module], bool]] = None  # a further test of a module of that type

    def matches(self, module: nn.Module) -> bool:
        if self.include_subclasses:
            typed = isinstance(module, self.source_type)
        else:
            typed = type(module) is self.source_type
        return typed and (self.when is None or bool(self.when(module)))


class ConversionRegistry:
    """Conversions in registration order; ``ordered()`` gives the order the converter applies them."""

    def __init__(self):
        self._conversions: List[Conversion] = []

    def register(
        self,
        source_type: type,
        factory: Factory,
        *,
        name: str,
        enabled: Optional[Callable[[ConverterOptions], bool]] = None,
        describe: Optional[Callable[[ConverterOptions], str]] = None,
        priority: int = PRIORITY_BACKEND,
        include_subclasses: bool = False,
        when: Optional[Callable[[nn.Module], bool]] = None,
    ) -> Conversion:
        """Add a conversion; the same ``(source_type, name)`` twice is an error."""
        if not (isinstance(source_type, type) and issubclass(source_type, nn.Module)):
            raise TypeError(f"conversion {name!r}: source_type must be an nn.Module subclass, got {source_type!r}")
        if not callable(factory):
            raise TypeError(f"conversion {name!r}: factory must be callable (module, options, context) -> nn.Module")
        for existing in self._conversions:
            if existing.source_type is source_type and existing.name == name:
                raise ValueError(
                    f"conversion {name!r} for {source_type.__qualname__} is already registered (factory "
                    f"{getattr(existing.factory, '__qualname__', existing.factory)!r} from "
                    f"{getattr(existing.factory, '__module__', '?')}); unregister it first or choose another name"
                )
        conversion = Conversion(
            name=name, source_type=source_type, factory=factory, enabled=enabled or _always,
            describe=describe, priority=int(priority), include_subclasses=include_subclasses, when=when,
        )
        self._conversions.append(conversion)
        return conversion

    def unregister(self, source_type: type, name: str) -> Conversion:
        """Remove and return the conversion registered as ``(source_type, name)``."""
        for i, existing in enumerate(self._conversions):
            if existing.source_type is source_type and existing.name == name:
                return self._conversions.pop(i)
        raise KeyError(f"no conversion {name!r} is registered for {source_type.__qualname__}")

    def ordered(self) -> List[Conversion]:
        """By ascending priority; ties keep registration order (the sort is stable)."""
        return sorted(self._conversions, key=lambda c: c.priority)

    def __iter__(self) -> Iterator[Conversion]:
        return iter(self.ordered())

    def __len__(self) -> int:
        return len(self._conversions)


# The registry ``ModuleConverter`` uses unless given another.
CONVERSIONS = ConversionRegistry()


def register_conversion(
    source_type: type,
    factory: Factory,
    *,
    name: str,
    enabled: Optional[Callable[[ConverterOptions], bool]] = None,
    describe: Optional[Callable[[ConverterOptions], str]] = None,
    priority: int = PRIORITY_BACKEND,
    include_subclasses: bool = False,
    when: Optional[Callable[[nn.Module], bool]] = None,
    registry: Optional[ConversionRegistry] = None,
) -> Conversion:
    """Register ``factory`` for ``source_type`` modules in ``registry`` (default: ``CONVERSIONS``).

    See the module docstring for the factory signature, ``enabled``, ``describe``, ``when`` and ordering.
    """
    return (registry if registry is not None else CONVERSIONS).register(
        source_type, factory, name=name, enabled=enabled, describe=describe,
        priority=priority, include_subclasses=include_subclasses, when=when,
    )
