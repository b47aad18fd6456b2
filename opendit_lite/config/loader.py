"""YAML + command-line loading of the typed schema, and the one reader of config objects, with
one-paragraph errors.

    cfg = load_config("configs/dit_s2.yaml", ["lr=2e-4", "model.name=DiT-B/2"])
    cfg = from_object(easydict_or_namespace_or_dict)   # LiteGen: any mapping or attribute object

Values given on the command line are parsed as YAML scalars (``true``, ``1e-4``, ``[1, 2]``, ``null``).
``null`` for a field that cannot be null takes its default (LiteGen's ``zero_degree: None`` is DDP).
Other spellings of a field (``schema.ALIASES``) are renamed by :func:`resolve_aliases`, the one
place aliases are read, before the sources are merged, so ``lr=...`` on the command line beats
``learning_rate:`` in the file. Every problem raises :class:`ConfigError` whose message says what
was wrong and what is allowed; scripts turn it into exit code 2 without a traceback
(``opendit_lite.utils.exit_codes.script_main``).
"""

import argparse
import dataclasses
import difflib
import functools
import math
import os
import sys
import types
import typing
from collections.abc import Mapping
from typing import Any, Dict, Iterable, List, Optional, Sequence

import yaml

from ..errors import ConfigError
from .paths import check_pipeline_path
from .schema import ALIASES, HINTS, LOGGERS, TrainConfig

# --------------------------------------------------------------------------------------------------
# Schema introspection
# --------------------------------------------------------------------------------------------------

def _fields(cls) -> Dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


@functools.lru_cache(maxsize=None)
def _hints(cls) -> Dict[str, Any]:
    return typing.get_type_hints(cls)


def all_keys(cls=TrainConfig, prefix: str = "") -> List[str]:
    """Every dotted key of the schema (sections and leaves)."""
    keys = []
    for name, tp in _hints(cls).items():
        key = prefix + name
        keys.append(key)
        if dataclasses.is_dataclass(tp):
            keys.extend(all_keys(tp, key + "."))
    return keys


def _closest(key: str, schema=TrainConfig) -> str:
    """" Did you mean ...?" for an unknown dotted key: a hint for another trainer's name, else the
    nearest schema key or alias (an alias suggests its field), else nothing. The cut-offs are high
    on purpose: a wrong suggestion (``learning_rate`` -> ``selective_ratio``) is worse than none."""
    leaf = key.rsplit(".", 1)[-1]
    if key in HINTS or leaf in HINTS:
        return f" Did you mean {HINTS.get(key, HINTS.get(leaf))}?"
    known = set(all_keys(schema))
    names = {k: k for k in known}
    names.update({alias: target for alias, target in ALIASES.items() if target in known})
    match = difflib.get_close_matches(key, list(names), n=1, cutoff=0.75)
    if not match:  # compare the last component too: "ema.decy" vs "decay"
        by_leaf = {k.rsplit(".", 1)[-1]: k for k in names}
        m = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.8)
        match = [by_leaf[m[0]]] if m else []
    return f" Did you mean '{names[match[0]]}'?" if match else ""


def _type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_type_name(a) for a in args) + " or null"
    if origin in (list, List):
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    return getattr(tp, "__name__", str(tp))


def _matches(value: Any, tp) -> bool:
    """Whether ``value`` is of the kind ``tp`` names (str, a list, a dict), without conversion."""
    origin = typing.get_origin(tp) or tp
    return isinstance(value, {list: (list, tuple), List: (list, tuple)}.get(origin, origin))


def _coerce(key: str, value: Any, tp) -> Any:
    """Check ``value`` against the annotation ``tp``; convert where lossless (int -> float)."""
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        for arg in args:  # the first alternative that takes the value as it is (a string, then a list)
            if len(args) == 1 or _matches(value, arg):
                return _coerce(key, value, arg)
        raise ConfigError(f"'{key}' must be a {_type_name(tp)}, got {value!r}.")
    if origin in (list, List):
        (item_tp,) = typing.get_args(tp)
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            value = [value]  # `class_labels=3` means [3]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"'{key}' must be a {_type_name(tp)}, got {value!r}.")
        return [_coerce(f"{key}[{i}]", v, item_tp) for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"'{key}' must be true or false, got {value!r}.")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"'{key}' must be an integer, got {value!r}.")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-4" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"'{key}' must be a number, got {value!r}.")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"'{key}' must be a string, got {value!r}.")
    return value


# --------------------------------------------------------------------------------------------------
# Building a config from nested dicts
# --------------------------------------------------------------------------------------------------

def resolve_aliases(tree: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """``tree`` (nested dicts, the section at dotted ``prefix``) with every alias of ``ALIASES``
    renamed to its field; an alias given together with its field is a ConfigError."""
    out: Dict[str, Any] = {}
    spelled: Dict[str, str] = {}  # field -> the key it was given as
    for raw_key, value in tree.items():
        full = prefix + str(raw_key)
        name = ALIASES.get(full, full)[len(prefix):]
        if name in out:
            raise ConfigError(f"'{spelled[name]}' and '{full}' are the same setting; give only one of them.")
        spelled[name] = full
        out[name] = resolve_aliases(value, prefix + name + ".") if isinstance(value, dict) else value
    return out


def _build(cls, values: Dict[str, Any], prefix: str = "", schema=None, ignored: Optional[List[str]] = None):
    """The dataclass ``cls`` from canonical nested dicts. Unknown keys raise, or are appended to
    ``ignored`` when a list is given."""
    if not isinstance(values, dict):
        raise ConfigError(f"'{prefix.rstrip('.') or 'config'}' must be a mapping of keys to values, got {values!r}.")
    fields, hints = _fields(cls), _hints(cls)
    kwargs = {}
    for name, value in values.items():
        key = prefix + str(name)
        if name not in fields:
            if ignored is not None:
                ignored.append(key)
                continue
            raise ConfigError(
                f"Unknown config key '{key}'.{_closest(key, schema or cls)} "
                f"Run with --help to list every key with its meaning."
            )
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            kwargs[name] = _build(tp, value if value is not None else {}, key + ".", schema or cls, ignored)
            continue
        if value is None and typing.get_origin(tp) is not typing.Union:
            continue  # null for a field that cannot be null: its default
        value = _coerce(key, value, tp)
        choices = fields[name].metadata.get("choices")
        if choices is not None and value not in choices:
            allowed = ", ".join("null" if c is None else repr(c) for c in choices)
            raise ConfigError(f"'{key}' must be one of {allowed}; got {value!r}.")
        kwargs[name] = value
    return cls(**kwargs)


def from_dict(cls, values: Dict[str, Any], prefix: str = ""):
    """Build (and type-check) the dataclass ``cls`` from a nested dict, e.g. a saved config section
    (older spellings of its keys included)."""
    if not isinstance(values, dict):
        return _build(cls, values, prefix)  # its error names the section
    return _build(cls, resolve_aliases(values, prefix), prefix)


def _plain(value: Any) -> Any:
    """Config objects as nested dicts: mappings (dict, EasyDict, OmegaConf), namespaces and
    dataclass instances become dicts; every other value is kept as it is."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    elif isinstance(value, (types.SimpleNamespace, argparse.Namespace)):
        value = vars(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items() if not str(k).startswith("_")}
    return value


def from_object(config: Any, schema=TrainConfig, strict: bool = True, ignored: Optional[List[str]] = None):
    """The typed, validated ``schema`` config from any config object: an instance of ``schema``
    (returned validated), another dataclass, a mapping (dict, EasyDict) or a namespace, nested
    sections of any of these kinds. Missing fields take their defaults; aliases are resolved.

    An unknown key is a ConfigError naming the nearest field; with ``strict=False`` unknown keys
    are skipped and listed in ``ignored`` (a list the caller passes) instead."""
    if isinstance(config, schema):
        validate(config)
        return config
    tree = _plain(config)
    if not isinstance(tree, dict):
        raise ConfigError(f"A config must be a mapping or an object with attributes (an EasyDict, a namespace, a "
                          f"dataclass); got a {type(config).__name__}.")
    if not strict and ignored is None:
        ignored = []
    cfg = _build(schema, resolve_aliases(tree), ignored=None if strict else ignored)
    validate(cfg)
    return cfg


def _set_dotted(tree: Dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def parse_overrides(overrides: Iterable[str]) -> Dict[str, Any]:
    """``["a=1", "b.c=x"]`` -> ``{"a": 1, "b": {"c": "x"}}`` (values parsed as YAML)."""
    tree: Dict[str, Any] = {}
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(
                f"Cannot read the argument '{item}': overrides are written key=value "
                f"(e.g. lr=2e-4 or model.name=DiT-B/2)."
            )
        key, text = item.split("=", 1)
        try:
            value = yaml.safe_load(text) if text != "" else None
        except yaml.YAMLError:
            value = text
        _set_dotted(tree, key.strip(), value)
    return tree


def _merge(base: Dict[str, Any], top: Dict[str, Any]) -> Dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _read_yaml(path: str) -> Dict[str, Any]:
    """The mapping of a YAML config file, or a ConfigError naming what is wrong with the file."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"Config file '{path}' does not exist. Pass an existing YAML file with --config.") from None
    except IsADirectoryError:
        raise ConfigError(f"Config path '{path}' is a directory. Pass a YAML file with --config.") from None
    except PermissionError:
        raise ConfigError(f"Config file '{path}' cannot be read (permission denied).") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"Config file '{path}' is not UTF-8 text (byte {e.start} cannot be decoded): pass a YAML "
                          f"file.") from None
    except OSError as e:
        raise ConfigError(f"Cannot read config file '{path}': {e.strerror or e}. Check its permissions.") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"Config file '{path}' is not valid YAML{where}: {getattr(e, 'problem', e)}.") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"Config file '{path}' must hold a mapping of keys to values at the top level (key: value "
                          f"lines), but it holds a {type(data).__name__}; see configs/demo.yaml for the layout.")
    return data


def check_sections(tree: Dict[str, Any], source: str, schema=TrainConfig, prefix: str = "") -> None:
    """Every section of ``schema`` that ``tree`` (from ``source``, e.g. "config file 'x.yaml'") sets is a
    mapping or null: a section given as a list or a number would otherwise be replaced without a word
    by a ``section.key=value`` override, or fail deep inside a reader of the config."""
    fields, hints = _fields(schema), _hints(schema)
    for name, value in tree.items():
        tp = hints.get(name) if name in fields else None
        if tp is None or not dataclasses.is_dataclass(tp) or value is None:
            continue
        key = prefix + str(name)
        if not isinstance(value, dict):
            kind = "a list" if isinstance(value, list) else f"the {type(value).__name__} {value!r}"
            raise ConfigError(f"'{key}' must be a mapping of keys to values (a section), but {source} gives it {kind}. "
                              f"Write it as '{key}:' followed by indented 'name: value' lines, as in "
                              f"configs/demo.yaml, or set single keys as {key}.<name>=<value>.")
        check_sections(value, source, tp, key + ".")


def load_config(path: Optional[str] = None, overrides: Sequence[str] = (), schema=TrainConfig):
    """Defaults < YAML file < ``key=value`` overrides, type-checked and range-checked.

    ``schema`` is the top-level dataclass: ``TrainConfig`` or a subclass (e.g. the video one), or a
    function choosing it from the file's and the command line's settings (``train_script_schema``)."""
    tree = resolve_aliases(_read_yaml(path) if path else {})
    top = resolve_aliases(parse_overrides(overrides))
    if not dataclasses.is_dataclass(schema):
        schema = schema(_merge(tree, top))
    check_sections(tree, f"config file '{path}'", schema)
    check_sections(top, "the command line", schema)
    cfg = _build(schema, _merge(tree, top))
    validate(cfg)
    return cfg


# --------------------------------------------------------------------------------------------------
# Range checks
# --------------------------------------------------------------------------------------------------

_RULES = {"at_least": (">=", lambda v, b: v >= b), "at_most": ("<=", lambda v, b: v <= b),
          "above": (">", lambda v, b: v > b), "below": ("<", lambda v, b: v < b)}


def _rule_text(bounds: Dict[str, float], is_int: bool) -> str:
    if bounds == {"at_least": 1} and is_int:
        return "be a positive integer"
    if bounds == {"above": 0}:
        return "be positive (> 0)"
    if set(bounds) == {"at_least", "at_most"}:
        return f"lie in [{bounds['at_least']:g}, {bounds['at_most']:g}]"
    if set(bounds) == {"at_least", "below"}:
        return f"lie in [{bounds['at_least']:g}, {bounds['below']:g})"
    if set(bounds) == {"above", "at_most"}:
        return f"lie in ({bounds['above']:g}, {bounds['at_most']:g}]"
    return "be " + " and ".join(f"{_RULES[k][0]} {b:g}" for k, b in bounds.items())


def _meaning(key: str, f: dataclasses.Field) -> str:
    return f" Meaning of {key}: {f.metadata['help']}." if f.metadata.get("help") else ""


def _optional_list(tp) -> bool:
    """Whether ``tp`` is ``Optional[List[...]]``."""
    args = typing.get_args(tp) if typing.get_origin(tp) is typing.Union else ()
    return type(None) in args and any(typing.get_origin(a) is list for a in args)


def check_ranges(cfg, prefix: str = "") -> None:
    """Every number of ``cfg`` (a schema dataclass, nested sections included) against its field's
    declared range (``schema._f``'s ``at_least``/``at_most``/``above``/``below``), and every float
    for finiteness: the one place numbers are range-checked. A violation is a ConfigError naming
    the key, the allowed range, what the field means and the value given."""
    hints = _hints(type(cfg))
    for f in dataclasses.fields(cfg):
        key, value = prefix + f.name, getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            check_ranges(value, key + ".")
            continue
        if isinstance(value, list) and not value and _optional_list(hints[f.name]):
            # null is the field's default meaning; an empty list would silently mean it too, or nothing
            raise ConfigError(f"'{key}' is an empty list: give at least one item, or remove the key (null) for its "
                              f"default.{_meaning(key, f)}")
        items = value if isinstance(value, (list, tuple)) else [value]
        for item in items:
            if isinstance(item, bool) or not isinstance(item, (int, float)):
                continue
            if isinstance(item, float) and not math.isfinite(item):
                raise ConfigError(f"'{key}' must be a finite number; got {item}.{_meaning(key, f)}")
            bounds = f.metadata.get("range", {})
            if not all(_RULES[k][1](item, b) for k, b in bounds.items()):
                raise ConfigError(f"'{key}' must {_rule_text(bounds, isinstance(item, int))}; got {item}."
                                  f"{_meaning(key, f)}")


def validate(cfg: TrainConfig) -> None:
    """Checks that need no knowledge of the launch (world size is checked by validate_world)."""
    check_ranges(cfg)
    if cfg.ac_offload and cfg.selective_ratio >= 1.0:
        raise ConfigError(
            "'ac_offload' offloads the inputs of checkpointed blocks, but selective_ratio=1 checkpoints "
            "none: set selective_ratio below 1 (0 checkpoints every block) or ac_offload=false."
        )
    if cfg.sp_ring_size is not None:
        if cfg.sp_mode != "usp":
            raise ConfigError(f"'sp_ring_size'={cfg.sp_ring_size} sets the ring degree of sp_mode=usp, but sp_mode is "
                              f"{cfg.sp_mode}: set sp_mode=usp, or remove sp_ring_size (sp_mode=ring rings over the "
                              f"whole sequence-parallel group).")
        if cfg.sp_size % cfg.sp_ring_size:
            divisors = [d for d in range(1, cfg.sp_size + 1) if cfg.sp_size % d == 0]
            raise ConfigError(f"'sp_ring_size'={cfg.sp_ring_size} must divide sp_size={cfg.sp_size} (USP runs Ulysses "
                              f"over sp_size / sp_ring_size ranks inside each ring step): choose one of "
                              f"{', '.join(map(str, divisors))}.")
    name = cfg.exp_name
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        raise ConfigError(f"'exp_name' {name!r} must be a plain folder name (no '/' or '\\', not '.' or '..'): it "
                          f"names the run folder and prefixes its checkpoints; e.g. exp_name=dit_s2.")
    if not cfg.ema.sharded:
        raise ConfigError("'ema.sharded'=false is not supported: the EMA is always sharded across the ZeRO group; it "
                          "holds the same values as a full copy in 1/ranks of the memory. Remove the key or set it "
                          "to true.")
    if cfg.encoder.group and not cfg.encoder.fsdp:
        raise ConfigError("'encoder.group' shards frozen encoders within a node, which needs encoder.fsdp=true; set "
                          "encoder.fsdp=true or remove encoder.group.")
    unknown = [name for name in cfg.logger if name not in LOGGERS]
    if unknown:
        raise ConfigError(f"'logger' lists {unknown}; the metric sinks are {', '.join(LOGGERS)} "
                          f"(metrics.jsonl is always written).")
    if cfg.lora.base_precision != "none" and not cfg.lora.rank:
        raise ConfigError(f"'lora.base_precision'={cfg.lora.base_precision} stores the frozen base of a LoRA run in "
                          f"low precision, but lora.rank=0 trains every weight: set lora.rank > 0 or "
                          f"lora.base_precision=none.")
    if cfg.memory.blocks_to_swap and not cfg.lora.rank:
        raise ConfigError(f"'memory.blocks_to_swap'={cfg.memory.blocks_to_swap} keeps frozen weights in host memory, "
                          f"but lora.rank=0 trains every weight (a full fine-tune): set lora.rank > 0, or for a full "
                          f"fine-tune use zero_degree=3 with memory.gemini_offload_optim_frac (python -m "
                          f"opendit_lite.plan prints what fits).")
    if cfg.memory.gemini_offload_optim_frac and cfg.zero_degree != 3:
        raise ConfigError(f"'memory.gemini_offload_optim_frac'={cfg.memory.gemini_offload_optim_frac} offloads "
                          f"Gemini's optimizer states, but zero_degree={cfg.zero_degree}: set zero_degree=3 or "
                          f"remove the key.")
    if cfg.lora.rank > 0 and cfg.zero_degree == 3:
        raise ConfigError("LoRA (lora.rank > 0) trains with zero_degree 0, 1 or 2; Gemini (zero_degree=3) shards "
                          "whole parameter chunks and cannot freeze the base: use zero_degree=2.")
    if cfg.precision == "fp8" and cfg.zero_degree == 3:
        raise ConfigError("precision=fp8 composes with zero_degree 0, 1 and 2; Gemini (zero_degree=3) keeps its "
                          "weights in chunks that torchao's float8 layers cannot wrap. Use zero_degree <= 2.")
    if getattr(cfg, "fused_optimizer_ema", False) and cfg.zero_degree == 3:
        raise ConfigError("'fused_optimizer_ema' covers zero_degree 0, 1 and 2; Gemini (zero_degree=3) updates "
                          "its chunks with HybridAdam. Set fused_optimizer_ema=false or zero_degree to 0, 1 or 2.")
    if getattr(cfg.model, "pipeline", None):  # a released model's folder, before the seconds of reading it
        check_pipeline_path(cfg.model.pipeline)
    # A data section lists which of its types read data.path, and what that path must hold.
    needs_path = getattr(type(cfg.data), "PATH_REQUIRED", {})
    if cfg.data.type in needs_path and not cfg.data.path:
        raise ConfigError(
            f"'data.path' is required for data.type={cfg.data.type!r}: point it at {needs_path[cfg.data.type]}."
        )
    if isinstance(cfg.data.path, list) and cfg.data.type != "folder":
        raise ConfigError(f"'data.path' is a list, which only data.type=folder reads (media folders mixed by repeats); "
                          f"data.type={cfg.data.type!r} reads one path: give one.")
    if isinstance(cfg.data.path, str) and "://" not in cfg.data.path and not os.path.exists(cfg.data.path):
        raise ConfigError(f"'data.path' {cfg.data.path!r} does not exist.")
    if cfg.model.input_size is not None and len(cfg.model.input_size) not in (1, 2):
        raise ConfigError(f"'model.input_size' must be [size] or [H, W]; got {cfg.model.input_size}.")


def validate_world(cfg: TrainConfig, world_size: int) -> None:
    """Checks that depend on the number of ranks: the SP degree and the global batch."""
    if world_size % cfg.sp_size != 0:
        raise ConfigError(
            f"'sp_size'={cfg.sp_size} must divide the number of ranks ({world_size}); "
            f"choose a divisor of {world_size} or launch a multiple of {cfg.sp_size} ranks."
        )
    dp = world_size // cfg.sp_size
    per_step = dp * cfg.grad_accum_steps
    if cfg.global_batch_size % per_step != 0:
        raise ConfigError(
            f"'global_batch_size'={cfg.global_batch_size} must be divisible by data-parallel size x "
            f"grad_accum_steps = {dp} x {cfg.grad_accum_steps} = {per_step}; e.g. use "
            f"{max(per_step, cfg.global_batch_size // per_step * per_step)}."
        )


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------

def format_help(cls=TrainConfig, prefix: str = "") -> str:
    lines = []
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        key, tp = prefix + f.name, hints[f.name]
        if dataclasses.is_dataclass(tp):
            lines.append(f"\n  [{key}] {f.metadata.get('help', '')}")
            lines.append(format_help(tp, key + "."))
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        choices = f.metadata.get("choices")
        allowed = f" {{{', '.join('null' if c is None else str(c) for c in choices)}}}" if choices else ""
        aliases = [a for a, target in ALIASES.items() if target == key]
        also = f" [also: {', '.join(aliases)}]" if aliases else ""
        lines.append(f"  {key:<28} {f.metadata.get('help', '')} (default: {default!r}){allowed}{also}")
    return "\n".join(lines)


def program_name() -> str:
    """How the running program was started, for usage lines: ``python train.py`` or
    ``python -m opendit_lite.evaluate``."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name.endswith(".__main__"):
        return f"python -m {spec.name[:-len('.__main__')]}"
    if spec is not None and spec.name and not spec.name.startswith("_"):
        return f"python -m {spec.name}"
    return f"python {os.path.basename(sys.argv[0]) or 'script.py'}"


def parse_cli(argv: Sequence[str], description: str, schema=TrainConfig):
    """``[--config FILE] [key=value ...]``; --help lists every key of ``schema``."""
    argv = list(argv)
    if "-h" in argv or "--help" in argv:
        print(f"{description}\n\nusage: {program_name()} [--config FILE.yaml] [--debug] [key=value ...]\n\n"
              f"keys:{format_help(schema if dataclasses.is_dataclass(schema) else schema({}))}")
        sys.exit(0)
    path = None
    rest = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--config":
            if i + 1 >= len(argv):
                raise ConfigError("--config needs a YAML file path after it.")
            path, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        elif arg.startswith("--"):
            raise ConfigError(f"Unknown option '{arg}'. Options are --config FILE, --debug and --help; settings are "
                              f"key=value.")
        else:
            rest.append(arg)
        i += 1
    return load_config(path, rest, schema)


def to_dict(cfg) -> Dict[str, Any]:
    return dataclasses.asdict(cfg)
