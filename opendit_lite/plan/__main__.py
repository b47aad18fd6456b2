"""Plan a run for a device size: ``python -m opendit_lite.plan --config CFG --gpu-memory 80 --world-size 8``.

Prints, per bucket of the config (or its one image/clip shape), the recommended batch per
data-parallel rank and the predicted memory, and for the run the zero_degree, sp_size,
selective_ratio and offload, with the assumptions behind them. ``key=value`` overrides after the
options change the config as on the trainers' command lines, e.g. ``precision=fp32``.
"""

import argparse
import sys

import yaml

from ..build.family import config_schema
from ..config import ConfigError, from_dict, parse_overrides
from . import plan_config, plan_precision


def _merged(tree: dict, top: dict) -> dict:
    out = dict(tree)
    for k, v in top.items():
        out[k] = _merged(out.get(k) or {}, v) if isinstance(v, dict) else v
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m opendit_lite.plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="a train.py or train_video.py YAML config")
    p.add_argument("--gpu-memory", type=float, required=True, help="memory per device in GiB, e.g. 80")
    p.add_argument("--world-size", type=int, default=1, help="devices in the run")
    p.add_argument("--max-batch", type=int, default=256, help="largest batch per rank to recommend")
    p.add_argument("--min-batch", type=int, default=1, help="every bucket must fit at least this batch")
    p.add_argument("--reserve", type=float, default=1.0, help="GiB kept free besides 10%% of the memory")
    p.add_argument("--keep-settings", action="store_true",
                   help="keep the config's zero_degree/sp_size/selective_ratio/ac_offload; only size the buckets")
    p.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = p.parse_args(argv)
    try:
        with open(args.config) as f:
            raw = yaml.safe_load(f) or {}
        tree = _merged(raw, parse_overrides(args.overrides))
        # Built without load_config's checks of data paths: planning needs no data.
        cfg = from_dict(config_schema(tree), tree)
        precision = plan_precision(cfg)
        result, buckets, shape = plan_config(cfg, args.gpu_memory, args.world_size, max_batch=args.max_batch,
                                             min_batch=args.min_batch, reserve_gib=args.reserve,
                                             fixed=args.keep_settings, precision=precision)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"plan for {args.config}: {args.world_size} device(s) of {args.gpu_memory:g} GiB, precision "
          f"{precision.name}" + (" (auto on a GPU)" if cfg.precision == "auto" else ""))
    print(result.table(buckets, shape))
    return 0


if __name__ == "__main__":
    sys.exit(main())
