"""The conversion registry and the converter's rules: duplicates, order, wrapping, declining,
context, sharing, training mode, options from keywords or a config object."""

import dataclasses
import types

import pytest
import torch.nn as nn

from opendit_lite.converter import (
    CONVERSIONS,
    PRIORITY_BACKEND,
    PRIORITY_WRAPPER,
    ConversionRegistry,
    ConverterOptions,
    ModuleConverter,
    register_conversion,
)


class Source(nn.Module):
    pass


class SourceChild(Source):
    pass


class Target(nn.Module):
    pass


class Wrapper(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner


def to_target(module, config, context):
    return Target()


def convert(model, registry, config=None, **context):
    return ModuleConverter(config, registry=registry, **context).convert(model)


def test_duplicate_source_type_and_name_raises():
    registry = ConversionRegistry()
    registry.register(Source, to_target, name="swap")
    with pytest.raises(ValueError, match="'swap' for Source is already registered"):
        registry.register(Source, to_target, name="swap")
    registry.register(Source, to_target, name="other")   # another name for the type is fine
    registry.register(Target, to_target, name="swap")    # the same name for another type too
    assert len(registry) == 3


def test_register_conversion_uses_the_default_registry():
    conversion = register_conversion(Source, to_target, name="test_default_registry")
    try:
        assert conversion in list(CONVERSIONS)
        with pytest.raises(ValueError, match="already registered"):
            register_conversion(Source, to_target, name="test_default_registry")
    finally:
        assert CONVERSIONS.unregister(Source, "test_default_registry") is conversion
    with pytest.raises(KeyError, match="no conversion"):
        CONVERSIONS.unregister(Source, "test_default_registry")


def test_bad_registrations_raise():
    registry = ConversionRegistry()
    with pytest.raises(TypeError, match="nn.Module subclass"):
        registry.register(int, to_target, name="x")
    with pytest.raises(TypeError, match="callable"):
        registry.register(Source, None, name="x")


def test_exact_type_matching_unless_subclasses_requested():
    registry = ConversionRegistry()
    registry.register(Source, to_target, name="swap")
    model = nn.Sequential(Source(), SourceChild())
    report = convert(model, registry)
    assert [type(m) for m in model] == [Target, SourceChild]
    assert report.replaced == [("0", Source, Target)]

    registry = ConversionRegistry()
    registry.register(Source, to_target, name="swap", include_subclasses=True)
    model = nn.Sequential(Source(), SourceChild())
    convert(model, registry)
    assert [type(m) for m in model] == [Target, Target]


def test_priority_then_registration_order_and_wrapping():
    registry = ConversionRegistry()
    # Registered first but with the wrapper priority: runs last and wraps the swapped module.
    registry.register(nn.Module, lambda m, cfg, ctx: Wrapper(m), name="wrap", priority=PRIORITY_WRAPPER,
                      include_subclasses=True, enabled=lambda cfg: True)
    registry.register(Source, to_target, name="swap", priority=PRIORITY_BACKEND)
    registry.register(Target, lambda m, cfg, ctx: Source(), name="swap_back")  # same priority, later: runs second
    assert [c.name for c in registry.ordered()] == ["swap", "swap_back", "wrap"]

    model = nn.Sequential(Source())
    report = convert(model, registry)
    assert isinstance(model[0], Wrapper) and type(model[0].inner) is Source
    assert [s.name for s in report.sections] == ["swap", "swap_back", "wrap"]
    assert report.counts() == {"swap": 1, "swap_back": 1, "wrap": 1}


def test_subtree_of_a_match_is_not_searched_by_the_same_conversion():
    registry = ConversionRegistry()
    registry.register(Source, lambda m, cfg, ctx: Source(), name="swap", include_subclasses=True)
    outer = Source()
    outer.inner = Source()
    model = nn.Sequential(outer)
    report = convert(model, registry)
    assert [r.qualified_name for r in report.replaced] == ["0"]


def test_factory_returning_the_module_leaves_it_and_is_not_reported():
    registry = ConversionRegistry()
    registry.register(Source, lambda m, cfg, ctx: m, name="decline")
    model = nn.Sequential(Source())
    original = model[0]
    report = convert(model, registry)
    assert model[0] is original and report.replaced == []
    assert "decline: on; nothing to replace" in str(report)


def test_factory_changing_the_module_in_place_reports_the_swapped_children():
    def wrap_child(module, config, context):  # e.g. sequence parallelism wrapping attn_op
        module.op = Wrapper(module.op)
        return module

    registry = ConversionRegistry()
    registry.register(Source, wrap_child, name="wrap_op")
    holder = Source()
    holder.op, holder.other = Target(), Target()
    model = nn.Sequential(holder)
    report = convert(model, registry)
    assert model[0] is holder and isinstance(holder.op, Wrapper)
    assert report.replaced == [("0.op", Target, Wrapper)]


def test_factory_must_return_a_module():
    registry = ConversionRegistry()
    registry.register(Source, lambda m, cfg, ctx: "oops", name="broken")
    with pytest.raises(TypeError, match="returned str for '0'"):
        convert(nn.Sequential(Source()), registry)


def test_disabled_conversion_replaces_nothing_and_is_reported_off():
    registry = ConversionRegistry()
    registry.register(Source, to_target, name="swap", enabled=lambda options: options.fused_adaln,
                      describe=lambda options: "why: because")
    model = nn.Sequential(Source())
    report = convert(model, registry, {"fused_adaln": False})
    assert type(model[0]) is Source and report.sections[0].enabled is False
    assert "swap: off; why: because" in str(report)
    convert(model, registry, fused_adaln=True)
    assert type(model[0]) is Target


def test_factory_receives_module_config_and_context():
    seen = {}

    def factory(module, config, context):
        seen.update(module=module, config=config, context=context)
        return Target()

    registry = ConversionRegistry()
    registry.register(Source, factory, name="swap")
    model, config, group = nn.Sequential(Source()), {"attention_backend": "auto"}, object()
    original = model[0]
    convert(model, registry, config, sp_group=group)
    assert seen == {"module": original, "config": ConverterOptions(attention_backend="auto"),
                    "context": {"sp_group": group}}


def test_shared_module_is_converted_once_and_stays_shared():
    registry = ConversionRegistry()
    registry.register(Source, to_target, name="swap")
    shared = Source()
    model = nn.Module()
    model.a, model.b = shared, shared
    model.branch = nn.Sequential(shared)
    report = convert(model, registry)
    assert type(model.a) is Target and model.a is model.b is model.branch[0]
    assert sorted(r.qualified_name for r in report.replaced) == ["a", "b", "branch.0"]


def test_training_mode_and_root_are_kept():
    registry = ConversionRegistry()
    registry.register(Source, to_target, name="swap")
    model = nn.Sequential(Source(), nn.Sequential(Source())).eval()
    convert(model, registry)
    assert not model[0].training and not model[1][0].training
    root = Source()
    convert(root, registry)
    assert type(root) is Source, "the root module is never replaced"


def test_options_from_keywords_config_objects_and_defaults():
    @dataclasses.dataclass
    class Config:
        fused_adaln: bool = True

    assert ModuleConverter(Config()).options.fused_adaln is True
    assert ModuleConverter(types.SimpleNamespace(attention_backend="flash")).options.attention_backend == "flash"
    assert ModuleConverter({"fused_layernorm": True}).options.fused_layernorm is True
    assert ModuleConverter(Config()).options.fused_layernorm is False   # missing: the default
    assert ModuleConverter(None).options == ConverterOptions() == ModuleConverter().options
    assert ModuleConverter().options.attention_backend == "sdpa"
    # An explicit keyword wins over the config object.
    assert ModuleConverter(Config(), fused_adaln=False).options.fused_adaln is False
