"""Plan a run for a device size: ``python -m opendit_lite.plan --config CFG --gpu-memory 80 --world-size 8``.

Prints, per bucket of the config (or its one image/clip shape), the recommended batch per
data-parallel rank and the predicted memory, and for the run the zero_degree, sp_size, the
sequence-parallel mode (what ``sp_mode: auto`` takes, and why), selective_ratio and offload, blocks to
swap and the base weights' precision (LoRA runs) or Gemini's optimizer offload (full fine-tunes), with
the assumptions behind them; then the config fragment that sets them, each key with what it saves at
the predicted peak and what it costs in step time. Settings that put weights, optimizer states or
activations in host memory must fit the node's host memory too (``--host-memory``, default: this
machine's RAM; plan on the training machine or give its size). When nothing fits it exits with 2 and
names the smallest device that would. ``key=value`` overrides after the options change the config as
on the trainers' command lines, e.g. ``precision=fp32``.
"""

import argparse
import math
import os
import sys
from typing import Optional

from ..utils.exit_codes import exit_at_once_on_stop_signals, heavy_imports, script_main

if __name__ == "__main__":
    exit_at_once_on_stop_signals()  # a Ctrl-C or SIGTERM during the imports below: exit 130 at once

# No torch here: the options and the config are checked before the planner's imports (seconds).
from ..config import (  # noqa: E402
    ConfigError,
    TrainConfig,
    check_sections,
    from_dict,
    parse_overrides,
    read_yaml,
    validate_world,
)
from ..config.paths import check_pipeline_path  # noqa: E402
from ..config.video_schema import VideoTrainConfig  # noqa: E402
from ..utils.options import OptionParser  # noqa: E402


def machine_host_gib() -> Optional[float]:
    """This machine's RAM in GiB (the smaller of the physical memory and a container's cgroup limit);
    None where the system does not say."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(limit_file) as f:
                limit = f.read().strip()
        except OSError:
            continue
        if limit.isdigit():
            total = min(total, int(limit))
    return total / 2 ** 30


def _number(text: str, kind, what: str, low: float, inclusive: bool):
    """``text`` as ``kind``, finite and above ``low`` (or equal, ``inclusive``)."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} must be {'an integer' if kind is int else 'a number'}, "
                                         f"got {text!r}") from None
    if not math.isfinite(value) or value < low or (value == low and not inclusive):
        bound = f">= {low:g}" if inclusive else f"> {low:g}"
        raise argparse.ArgumentTypeError(f"{what} must be a finite number {bound}, got {text!r}")
    return value


def _merged(tree: dict, top: dict) -> dict:
    out = dict(tree)
    for k, v in top.items():
        out[k] = _merged(out.get(k) or {}, v) if isinstance(v, dict) else v
    return out


def _check_config(tree: dict) -> None:
    """What the schemas alone can refuse (an unknown key, a bad value), before the model registry is
    imported to tell which schema the model takes: a config that neither the image nor the video
    schema accepts is refused with the error of the one its sections point to (a text_encoder
    section: the video one)."""
    video_first = "text_encoder" in tree
    schemas = (VideoTrainConfig, TrainConfig) if video_first else (TrainConfig, VideoTrainConfig)
    first = None
    for schema in schemas:
        try:
            from_dict(schema, tree)
            return
        except ConfigError as e:
            first = first or e
    raise first


@script_main
def main(argv) -> int:
    p = OptionParser(prog="python -m opendit_lite.plan", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="a train.py or train_video.py YAML config")
    p.add_argument("--gpu-memory", type=lambda t: _number(t, float, "the memory per device (GiB)", 0, False),
                   required=True, help="memory per device in GiB, e.g. 80")
    p.add_argument("--world-size", type=lambda t: _number(t, int, "the number of devices", 1, True),
                   default=1, help="devices in the run")
    p.add_argument("--max-batch", type=lambda t: _number(t, int, "the largest batch", 1, True), default=256,
                   help="largest batch per rank to recommend")
    p.add_argument("--min-batch", type=lambda t: _number(t, int, "the smallest batch", 1, True), default=1,
                   help="every bucket must fit at least this batch")
    p.add_argument("--reserve", type=lambda t: _number(t, float, "the reserve (GiB)", 0, True), default=1.0,
                   help="GiB kept free besides 10%% of the memory")
    p.add_argument("--gpus-per-node", type=lambda t: _number(t, int, "GPUs per node", 1, True), default=8,
                   help="an SP group larger than a node spans nodes (sp_mode=auto times it on the slower links)")
    p.add_argument("--host-memory", type=lambda t: _number(t, float, "the host memory per node (GiB)", 0, False),
                   default=None, help="host memory (RAM) per node in GiB, for swapped blocks and offloaded states "
                                      "and activations (default: this machine's)")
    p.add_argument("--keep-settings", action="store_true",
                   help="keep the config's zero_degree/sp_size/selective_ratio/ac_offload, memory.blocks_to_swap and "
                        "lora.base_precision; only size the buckets")
    p.add_argument("--tflops", type=lambda t: _number(t, float, "the achieved TFLOP/s", 0, False),
                   default=None, help="achieved bf16 matmul TFLOP/s of the device (step-time costs; default: the "
                                     "planner's assumed device)")
    p.add_argument("--h2d-gbps", type=lambda t: _number(t, float, "the host-to-device GB/s", 0, False),
                   default=None, help="pinned host-to-device copy GB/s (cost of swapping, offload; default: the "
                                       "planner's assumed device)")
    p.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = p.parse_args(argv)
    if args.min_batch > args.max_batch:
        raise ConfigError(f"--min-batch {args.min_batch} is larger than --max-batch {args.max_batch}.")
    file_tree, top = read_yaml(args.config), parse_overrides(args.overrides)
    # Sections before merging, which would replace a list section by an override's mapping (the video
    # schema declares every section the image schema does).
    check_sections(file_tree, f"config file '{args.config}'", VideoTrainConfig)
    check_sections(top, "the command line", VideoTrainConfig)
    tree = _merged(file_tree, top)
    _check_config(tree)
    if isinstance(tree.get("model"), dict) and tree["model"].get("pipeline"):
        check_pipeline_path(tree["model"]["pipeline"])  # before the seconds of importing the planner
    with heavy_imports():
        from ..builders.family import config_schema
        from . import plan_config, plan_precision
        from .fragment import config_fragment
        from .weight_costs import Speed
    # Built without load_config's checks of data paths: planning needs no data.
    cfg = from_dict(config_schema(tree), tree)
    if args.keep_settings:  # the run as configured must be able to start at this world size
        validate_world(cfg, args.world_size)
    precision = plan_precision(cfg)
    given = {"tflops": args.tflops, "h2d_gbps": args.h2d_gbps}
    speed = Speed(**{k: v for k, v in given.items() if v is not None})
    host_gib = args.host_memory if args.host_memory is not None else machine_host_gib()
    result, buckets, shape = plan_config(cfg, args.gpu_memory, args.world_size, max_batch=args.max_batch,
                                         min_batch=args.min_batch, reserve_gib=args.reserve,
                                         fixed=args.keep_settings, precision=precision,
                                         ranks_per_node=args.gpus_per_node,
                                         speed=speed, host_gib=host_gib)
    host = ("host memory not checked (this machine does not report its RAM: --host-memory)" if host_gib is None
            else f"{host_gib:.1f} GiB host memory per node" + ("" if args.host_memory is not None
                                                               else " (this machine's; --host-memory)"))
    print(f"plan for {args.config}: {args.world_size} device(s) of {args.gpu_memory:g} GiB, {host}, precision "
          f"{precision.name}" + (" (auto on a GPU)" if cfg.precision == "auto" else ""))
    print(result.table(buckets, shape))
    print()
    raw = [dict(b) for b in cfg.data.buckets] if getattr(cfg.data, "buckets", None) else []
    print(config_fragment(cfg, result, result.costs.per_sample, raw, args.world_size, args.gpu_memory))
    return 0


if __name__ == "__main__":
    sys.exit(main())
