"""Sampling speed and its quality cost: for the image demo (configs/demo.yaml, DiT-Mini/2), the video
demo (configs/video_stdit_demo.yaml, STDiT-tiny) and one diffusers family (configs/wan_tiny_demo.yaml,
a tiny Wan), the wall time and the transformer work of 1 process, sequence parallelism over 2 ranks,
CFG-parallel ranks (guidance's two branches on 2 ranks) and each step cache on 1 process, against 1
process without cache in the same run; and each cache's samples against the uncached samples of the
same seed (PSNR over the pixels in [-1, 1], peak-to-peak 2) and, for the image demo with
``--inception``, the FID of the samples against the demo's classes (``opendit_lite.evaluate``).

    make demo demo-video demo-wan                         # the trained checkpoints (else random weights)
    python benchmarks/sampling_speed.py                   # reads outputs/<demo>/checkpoints
    python benchmarks/sampling_speed.py --runs /tmp/runs --inception /models/weights-inception-2015-12-05-6726825d.pth
    python benchmarks/sampling_speed.py --dry             # tiny sizes, 3 steps: the whole path in seconds

Every row loads its model once and samples the demo's whole class or prompt list once per repeat
(after an untimed warm-up run, which also calibrates MagCache's ratios); the time is the fastest
repeat of the sampling loop. All rows run in one launch of 2 gloo processes with one thread each,
and the repeats are interleaved (every row in turn, repeat after repeat), so that other work on the
cores weighs on every row alike: a one-process row runs on rank 0 while rank 1 waits, a 2-rank row
on both. "1 process" (one core) is the baseline; "1 process, 2 threads" shows what a second core
gives one process. Each row also reports rank 0's CPU time (its fastest repeat): on cores shared
with other work it measures the work a row does more steadily than the wall time. With random
weights (no trained checkpoint) the PSNR says nothing about a cache's quality: the rows say which
weights they had. Writes benchmarks/results/sampling_speed.{json,md}; docs/sampling.md's table is
``doc_table`` of the json.
"""

import argparse
import datetime
import json
import math
import os
import platform
import sys
import tempfile
import time
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT]

import torch  # noqa: E402

from opendit_lite.sampling.cache import DEFAULTS  # noqa: E402

# demo -> (config, what it is); the dry size shrinks each to seconds.
DEMOS = {
    "image": ("configs/demo.yaml", "DiT-Mini/2, 8 classes x 4, 16x16 px"),
    "video": ("configs/video_stdit_demo.yaml", "STDiT-tiny, 4 prompts, 4x16x16 px"),
    "wan": ("configs/wan_tiny_demo.yaml", "Wan (diffusers), 4 prompts, 4x16x16 px"),
}
DRY = {
    "image": ["model.name=DiT-T/2", "data.image_size=8", "sample.samples_per_class=1"],
    "video": ["data.image_size=8", "data.num_frames=2", 'sample.prompts=["a red square moving right"]'],
    "wan": ["data.image_size=8", "data.num_frames=2", 'sample.prompts=["a red square moving right"]'],
}
FULL = {"image": ["sample.samples_per_class=4"], "video": [], "wan": []}
CACHE_KINDS = [kind for kind in DEFAULTS if kind != "none"]
# (row name, ranks, torch threads per rank, settings). "1 process" (one thread: one core) is every row's
# baseline; "1 process, 2 threads" shows what the second core gives one process on these small models.
SETTINGS = [("1 process", 1, 1, []), ("1 process, 2 threads", 1, 2, []), ("sp 2", 2, 1, ["sp_size=2"]),
            ("cfg-parallel 2", 2, 1, ["sample.cfg_parallel=true"])] + [
    (f"cache {kind}", 1, 1, [f"sample.cache.kind={kind}"]) for kind in CACHE_KINDS]


def demo_config(demo: str, overrides: List[str]):
    from opendit_lite.config import load_config
    from opendit_lite.config.video_schema import VideoTrainConfig

    path = os.path.join(ROOT, DEMOS[demo][0])
    return load_config(path, overrides, **({} if demo == "image" else {"schema": VideoTrainConfig}))


def random_checkpoint(demo: str, overrides: List[str], folder: str) -> str:
    """A checkpoint folder of the demo's model with random weights (every layer, the zero-initialised
    ones too, drawn small): what the sampler loads when the demo has not been trained."""
    from safetensors.torch import save_file

    from opendit_lite.config import to_dict

    cfg = demo_config(demo, overrides)
    if demo == "image":
        from opendit_lite.builders.image import (
            build_dataset_from_config,
            build_model_from_config,
            resolve_model_geometry,
        )

        resolve_model_geometry(cfg, build_dataset_from_config(cfg))
        model = build_model_from_config(cfg)
    else:
        from opendit_lite.builders.video import build_video_model
        from opendit_lite.training.video import prepare_video_data, validate_video_config

        validate_video_config(cfg)
        prepare_video_data(cfg, "cpu")  # the geometry and objective a training run resolves and saves
        model = build_video_model(cfg)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.03)
    ckpt = os.path.join(folder, f"{demo}_random_step0")
    os.makedirs(ckpt)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(ckpt, "model.safetensors"))
    with open(os.path.join(ckpt, "meta.json"), "w") as f:
        json.dump({"extra_state": {"config": to_dict(cfg)}}, f)
    return ckpt


def trained_checkpoint(demo: str, runs: str) -> Optional[str]:
    """The newest checkpoint of the demo's run under ``runs`` (None when it has not been trained)."""
    from opendit_lite.checkpoint.layout import resolve_sample_checkpoint
    from opendit_lite.config import ConfigError

    cfg = demo_config(demo, [f"results_dir={runs}"])
    try:
        return resolve_sample_checkpoint(cfg, None, "train")
    except (ConfigError, FileNotFoundError):
        return None


class Row:
    """One row's sampler, loaded once on the ranks it runs on (``ranks``: one process, or the mesh of
    this launch); ``run()`` samples the demo's whole class or prompt list once and times it."""

    def __init__(self, demo: str, overrides: List[str], ranks):
        from opendit_lite.sampling.fast import fast_sampling

        cfg = self.cfg = demo_config(demo, overrides)
        self.ranks = ranks
        if demo == "image":
            from opendit_lite.sampling.image import class_labels, image_batches, load_image_model

            model, _, vae, _ = load_image_model(cfg, ranks)
            labels = class_labels(cfg.model.num_classes, None, cfg.sample.samples_per_class)
            self._batches = lambda fast: image_batches(model, cfg, labels, ranks, vae, fast=fast)
        else:
            from opendit_lite.sampling.video import find_video_checkpoint, load_video_model, read_prompts, video_batches
            from opendit_lite.training.video import validate_video_config

            validate_video_config(cfg)
            ckpt = find_video_checkpoint(cfg)
            prompts = read_prompts(cfg)
            model, captions, vae = load_video_model(cfg, ckpt, ranks)
            self._batches = lambda fast: video_batches(model, cfg, prompts, ranks, captions, vae, fast=fast)
        self.fast = fast_sampling(model, cfg, ranks)
        self.seconds: List[float] = []
        self.cpu_seconds: List[float] = []
        self.run(timed=False)  # warm-up (and MagCache's calibration when it has no ratios)

    def run(self, timed: bool = True) -> None:
        import torch.distributed as dist

        from opendit_lite.sampling import gather_on_main

        cache, multi = self.fast.cache, self.ranks.world_size > 1
        before = (cache.calls, cache.blocks_run, cache.attention_run) if cache else None
        if multi:
            dist.barrier(group=self.ranks.batch_group)
        start, cpu = time.perf_counter(), time.process_time()
        mine = [x for _, x in self._batches(self.fast)]
        if multi:
            dist.barrier(group=self.ranks.batch_group)
        if timed:
            self.seconds.append(time.perf_counter() - start)
            self.cpu_seconds.append(time.process_time() - cpu)
        self.samples = gather_on_main(torch.cat(mine), self.ranks)
        if cache:  # this run's share of the forwards that ran
            calls = cache.calls - before[0]
            ran, full = ((cache.attention_run - before[2], calls * cache.num_attention) if cache.kind == "pab"
                         else (cache.blocks_run - before[1], calls * cache.num_blocks))
            self.calls, self.computed = calls, ran / full
        else:
            self.calls, self.computed = self.cfg.sample.num_sampling_steps * len(mine), 1.0  # steps x batches

    def result(self) -> Dict:
        cache = self.fast.cache
        return {"seconds": min(self.seconds), "all_seconds": self.seconds, "cpu_seconds": min(self.cpu_seconds),
                "samples": self.samples, "calls": self.calls, "computed": self.computed,
                "mag_ratios": cache.settings.get("mag_ratios") if cache else None}


def _measure(rank: int, world_size: int, plans, repeats: int) -> Optional[Dict]:
    """Every row of ``plans`` ({key: (demo, overrides, ranks, threads)}) on this 2-rank launch, the
    timed runs interleaved (repeat after repeat, every row in turn) so that other work on the cores
    weighs on every row alike; a one-process row runs on rank 0 while rank 1 waits."""
    import torch.distributed as dist

    from opendit_lite.sampling import sampling_ranks
    from opendit_lite.sampling.sharding import _single_process

    rows = {}
    for key, (demo, overrides, ranks, threads) in plans.items():
        torch.set_num_threads(threads)
        if ranks == 1:
            rows[key] = Row(demo, overrides, _single_process()) if rank == 0 else None
        else:
            cfg = demo_config(demo, overrides)
            with sampling_ranks(cfg.sp_size, cfg.sample.cfg_parallel) as mesh:  # the launch's groups stay up
                rows[key] = Row(demo, overrides, mesh)
        dist.barrier()
    for _ in range(repeats):
        for key, (_, _, ranks, threads) in plans.items():
            torch.set_num_threads(threads)
            if rows[key] is not None:
                rows[key].run()
            dist.barrier()
    return {key: row.result() for key, row in rows.items()} if rank == 0 else None


def psnr(samples: torch.Tensor, reference: torch.Tensor) -> float:
    """PSNR in dB of ``samples`` against ``reference``, both in [-1, 1] (peak-to-peak 2)."""
    mse = (samples.float().clamp(-1, 1) - reference.float().clamp(-1, 1)).pow(2).mean().item()
    return math.inf if mse == 0 else 10 * math.log10(4.0 / mse)


def fid_scores(demo_overrides: List[str], sets: Dict[str, torch.Tensor], inception: str) -> Dict[str, float]:
    """FID of each set of images [N, 3, H, W] in [-1, 1] against the image demo's classes (its shapes data)."""
    import numpy as np

    from opendit_lite.builders.image import build_dataset_from_config
    from opendit_lite.evaluate import load_inception, score_images
    from opendit_lite.evaluate.generate import to_uint8
    from opendit_lite.evaluate.reference import Reference, statistics

    cfg = demo_config("image", demo_overrides)
    dataset = build_dataset_from_config(cfg)
    real = torch.stack([dataset[i][0] for i in range(min(len(dataset), 2048))])  # [N, 3, H, W] in [-1, 1]
    extract = load_inception(inception, "cpu")
    from opendit_lite.evaluate.features import extract_features

    features, _ = extract_features(extract, to_uint8(real), 50, False)
    mu, sigma = statistics(features)
    reference = Reference(np.asarray(mu), np.asarray(sigma), features)
    return {name: score_images(to_uint8(images), reference, extract, 50)["fid"] for name, images in sets.items()}


def run(args) -> Dict:
    from tests.distributed import run_distributed

    load_before = os.getloadavg()[0]
    size = DRY if args.dry else FULL
    steps = ["sample.num_sampling_steps=3"] if args.dry else []
    rows, weights, checkpoints = [], {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        base = {}
        for demo in DEMOS:
            ckpt = None if args.dry else trained_checkpoint(demo, args.runs)
            weights[demo] = "trained" if ckpt else "random"
            if ckpt is None:
                ckpt = random_checkpoint(demo, size[demo] + steps, tmp)
                print(f"{demo}: no trained checkpoint under {args.runs}/ (make demo / demo-video / demo-wan): random "
                      f"weights, so the PSNR of the caches says nothing about their quality", flush=True)
            base[demo] = size[demo] + steps + [f"sample.ckpt={ckpt}"]
            checkpoints[demo] = os.path.basename(os.path.normpath(ckpt))
        plans = {f"{demo}|{name}": (demo, base[demo] + settings, ranks, threads) for demo in DEMOS
                 for name, ranks, threads, settings in SETTINGS}
        measured = run_distributed(_measure, 2, args=(plans, args.repeats), env={"OMP_NUM_THREADS": "1"})[0]
        results = {tuple(key.split("|")): value for key, value in measured.items()}
        ratios = {demo: results[demo, "cache magcache"]["mag_ratios"] for demo in DEMOS}
        fids = {}
        if args.inception:
            fids = fid_scores(size["image"] + steps, {name: results["image", name]["samples"]
                                                      for name, _, _, _ in SETTINGS}, args.inception)
    for demo in DEMOS:
        plain = results[demo, "1 process"]
        for name, ranks, threads, _ in SETTINGS:
            r = results[demo, name]
            rows.append({"demo": demo, "model": DEMOS[demo][1], "weights": weights[demo], "setting": name,
                         "ranks_x_threads": f"{ranks} x {threads}",
                         "seconds": round(r["seconds"], 3), "speedup": round(plain["seconds"] / r["seconds"], 2),
                         "all_seconds": [round(t, 3) for t in r["all_seconds"]],
                         "cpu_seconds": round(r["cpu_seconds"], 3),
                         "cpu_speedup": round(plain["cpu_seconds"] / r["cpu_seconds"], 2),
                         "model_calls": r["calls"], "computed": round(r["computed"], 3),
                         "psnr_db": round(psnr(r["samples"], plain["samples"]), 1),
                         "fid": round(fids[name], 2) if demo == "image" and name in fids else None})
    return {"machine": machine(), "date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "dry": args.dry, "repeats": args.repeats, "checkpoints": checkpoints, "mag_ratios": ratios,
            "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],  # other work on the cores
            "cache_defaults": {k: v for k, v in DEFAULTS.items() if k != "none"}, "rows": rows}


def machine() -> str:
    """The CPU this ran on, e.g. "AMD EPYC 7B13, 2 cores (x86_64)"."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{name}, {os.cpu_count()} cores ({platform.machine()})"


def doc_table(results: Dict) -> List[str]:
    """The table of docs/sampling.md: one row per demo and setting."""
    head = ["demo", "setting", "ranks x threads", "seconds", "speed-up", "rank-0 CPU s", "CPU speed-up", "model calls",
            "computed", "PSNR dB", "FID"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results["rows"]:
        psnr_cell = "exact" if math.isinf(r["psnr_db"]) else f"{r['psnr_db']:.1f}"
        fid = "n/a" if r["fid"] is None else f"{r['fid']:.2f}"
        demo = f"{r['demo']} ({r['weights']} weights)"
        lines.append("| " + " | ".join([demo, r["setting"], r["ranks_x_threads"], f"{r['seconds']:.2f}",
                                        f"{r['speedup']:.2f}x", f"{r['cpu_seconds']:.2f}", f"{r['cpu_speedup']:.2f}x",
                                        str(r["model_calls"]), f"{r['computed']:.0%}", psnr_cell, fid]) + " |")
    return lines


README_SETTINGS = ("1 process", "cfg-parallel 2", "cache teacache", "cache magcache")


def readme_table(results: Dict) -> List[str]:
    """The README's sampling table: per demo, one process, CFG-parallel ranks and the two caches that
    reuse whole steps (the full table: ``doc_table``, docs/sampling.md)."""
    head = ["demo", "setting", "seconds", "speed-up", "PSNR dB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results["rows"]:
        if r["setting"] in README_SETTINGS:
            psnr_cell = "exact" if math.isinf(r["psnr_db"]) else f"{r['psnr_db']:.1f}"
            lines.append("| " + " | ".join([r["demo"], r["setting"], f"{r['seconds']:.2f}", f"{r['speedup']:.2f}x",
                                            psnr_cell]) + " |")
    return lines


def write(results: Dict, out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "sampling_speed.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)  # an exact PSNR is written as Infinity
    with open(os.path.join(out_dir, "sampling_speed.md"), "w") as f:
        f.write(f"sampling_speed ({results['date']}, {results['machine']}, torch {results['torch']}; checkpoints: "
                f"{', '.join(f'{d} {c}' for d, c in results['checkpoints'].items())}; 1-minute load average "
                f"{results['load_average'][0]} at the start, {results['load_average'][1]} at the end)\n\n")
        f.write("\n".join(doc_table(results)) + "\n")
    return path


def main(argv=None) -> Dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default=os.path.join(ROOT, "outputs"), help="results_dir of the trained demos")
    parser.add_argument("--inception", default=None, help="InceptionV3 weights for the image demo's FID")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats of each row (the fastest counts)")
    parser.add_argument("--dry", action="store_true", help="tiny sizes and 3 steps: check the path, time nothing")
    parser.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    args = parser.parse_args(argv)
    if args.dry:
        args.repeats = 1
    results = run(args)
    print("\n".join(doc_table(results)))
    if not args.dry or args.out_dir != os.path.join(HERE, "results"):
        print(f"wrote {write(results, args.out_dir)}")
    return results


if __name__ == "__main__":
    main()
