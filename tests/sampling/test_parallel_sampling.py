"""sample.py and sample_video.py on 2 gloo ranks give the one-process outputs for the same seed:
samples split over data-parallel ranks (uneven blocks, several batches per rank), one sample's
tokens sharded over a sequence-parallel pair (Ulysses; DSP for STDiT), and guidance's two branches
on two ranks (sample.cfg_parallel), also with a step cache (against one process with the same
cache); and on 4 ranks (the shared spawn of tests/parallel/spawn.py)
over a sequence-parallel group of 4 with ring attention and with USP (rings of 2 x Ulysses over 2),
and the two branches on two sequence-parallel pairs. Tiny models with random weights (adaLN-Zero layers perturbed so
the output depends on every block), a few steps, DDPM (which draws noise at every step) for images
and Euler for video."""

import json
import os
import sys
import tempfile

import numpy as np
import pytest
import torch
import torch.distributed as dist
from PIL import Image
from safetensors.torch import save_file

from tests.distributed import run_distributed
from tests.parallel.spawn import rank_checks
from tests.parallel.spawn import results as spawn_results

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def perturb(model: torch.nn.Module, seed: int) -> None:
    """Random weights everywhere, zero-initialised adaLN and output layers included."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)


def image_args(tmp) -> list:
    """sample.py arguments for a random DiT-T/2 saved as an original DiT .pt (3 classes x 3 samples)."""
    from opendit_lite.models import build_model

    model = build_model("DiT-T/2", input_size=16, in_channels=3, num_classes=3)
    perturb(model, 0)
    pt = os.path.join(tmp, "dit.pt")
    torch.save({"model": model.state_dict(), "ema": model.state_dict()}, pt)
    return ["--config", os.path.join(ROOT, "configs/demo.yaml"), f"sample.ckpt={pt}", "model.name=DiT-T/2",
            "model.num_classes=3", "model.learn_sigma=true", "diffusion.objective=iddpm", "sample.sampler=ddpm",
            "data.image_size=16", "sample.num_sampling_steps=3", "sample.samples_per_class=3", "sample.cfg_scale=2"]


def video_args(tmp) -> list:
    """sample_video.py arguments for a random STDiT-tiny in a checkpoint folder with its config (3 prompts)."""
    from opendit_lite.builders.video import build_video_model
    from opendit_lite.config import load_config, to_dict
    from opendit_lite.config.video_schema import VideoTrainConfig

    config = os.path.join(ROOT, "configs/video_stdit_demo.yaml")
    cfg = load_config(config, ["model.in_channels=3", "model.num_frames=4", "model.input_size=[8,8]",
                               "model.caption_channels=32", "data.image_size=8"], schema=VideoTrainConfig)
    model = build_video_model(cfg)
    perturb(model, 1)
    ckpt = os.path.join(tmp, "stdit_step1")
    os.makedirs(ckpt)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(ckpt, "model.safetensors"))
    with open(os.path.join(ckpt, "meta.json"), "w") as f:
        json.dump({"extra_state": {"config": to_dict(cfg)}}, f)
    prompts = '["a red square moving right","a blue disc moving down","a green disc moving left"]'
    return ["--config", config, f"sample.ckpt={ckpt}", "sample.num_sampling_steps=2", f"sample.prompts={prompts}"]


def run_script(name: str, argv: list):
    import importlib

    return importlib.import_module(name).main(argv)


# (script, settings on 2 ranks); each output is compared with the one-process output.
CASES = {
    "image_dp": ("sample", ["sample.batch_size=2"]),                      # 5 + 4 samples, 3 + 2 batches
    "image_sp": ("sample", ["sp_size=2"]),
    "video_dp": ("sample_video", ["sample.batch_size=1"]),                # 2 + 1 prompts
    "video_ulysses": ("sample_video", ["sp_size=2", "sp_mode=ulysses"]),
    "video_dsp": ("sample_video", ["sp_size=2", "sp_mode=dsp"]),
    "image_cfg_parallel": ("sample", ["sample.cfg_parallel=true"]),               # guidance's branches on 2 ranks
    "video_cfg_parallel": ("sample_video", ["sample.cfg_parallel=true"]),
}


# (script, step-cache settings): on 2 CFG-parallel ranks, compared with one process with the same cache.
CACHED = {
    "image_cfg_parallel_pab": ("sample", ["sample.cache.kind=pab", "sample.cache.timesteps=[0,1000]"]),
    "video_cfg_parallel_first_block": ("sample_video", ["sample.cache.kind=first_block", "sample.cache.threshold=1"]),
}


def _output(script: str, folder: str, case: str) -> list:
    return [f"sample.output={folder}/{case}.png"] if script == "sample" else [f"sample.output_dir={folder}/{case}"]


def _two_ranks(rank, world_size, args_by_script, out_dir):
    torch.manual_seed(1234 + rank)  # the global RNG must not matter
    written = {}
    for case, (script, cache) in CACHED.items():
        written[case] = run_script(script, args_by_script[script] + ["sample.cfg_parallel=true"] + cache +
                                   _output(script, out_dir, case))
    for case, (script, extra) in CASES.items():
        output = ([f"sample.output={out_dir}/{case}.png"] if script == "sample"
                  else [f"sample.output_dir={out_dir}/{case}"])
        written[case] = run_script(script, args_by_script[script] + extra + output)
    return written


# (script, settings on 4 ranks): one sequence-parallel group of 4 (the models have 4 heads).
CASES_4 = {
    "image_ring": ("sample", ["sp_size=4", "sp_mode=ring"]),
    "image_usp": ("sample", ["sp_size=4", "sp_mode=usp", "sp_ring_size=2"]),
    "video_ring": ("sample_video", ["sp_size=4", "sp_mode=ring"]),
    "video_usp": ("sample_video", ["sp_size=4", "sp_mode=usp", "sp_ring_size=2"]),
    "video_cfg_parallel_sp": ("sample_video", ["sp_size=2", "sample.cfg_parallel=true"]),  # 2 branches x sp 2
}


@rank_checks("sampling", world_size=4)
def _four_ranks(rank, world_size):
    """The CASES_4 outputs as pixel arrays (rank 0; the files live in a folder rank 0 removes)."""
    with tempfile.TemporaryDirectory() as tmp:
        shared = [(tmp, {"sample": image_args(tmp), "sample_video": video_args(tmp)}) if rank == 0 else None]
        dist.broadcast_object_list(shared, src=0)   # rank 0's folder and checkpoints, for every rank
        folder, args = shared[0]
        out = {}
        for case, (script, extra) in CASES_4.items():
            output = ([f"sample.output={folder}/{case}.png"] if script == "sample"
                      else [f"sample.output_dir={folder}/{case}"])
            written = run_script(script, args[script] + extra + output)
            if rank == 0:
                out[case] = pixels(written if script == "sample" else written[-1])
        dist.barrier()  # every rank is done with the checkpoints before rank 0 removes them
        return out


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("parallel_sampling"))
    args = {"sample": image_args(tmp), "sample_video": video_args(tmp)}
    single = {"sample": run_script("sample", args["sample"] + [f"sample.output={tmp}/single.png"]),
              "sample_video": run_script("sample_video", args["sample_video"] + [f"sample.output_dir={tmp}/single"])}
    for case, (script, cache) in CACHED.items():
        single[case] = run_script(script, args[script] + cache + _output(script, f"{tmp}/single", case))
    ranks = run_distributed(_two_ranks, 2, args=(args, tmp), env={"OMP_NUM_THREADS": "1"})
    return single, ranks


def pixels(path: str) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB")).astype(np.int16)


@pytest.mark.parametrize("case", list(CASES))
def test_two_ranks_equal_one_process(outputs, case):
    single, ranks = outputs
    script = CASES[case][0]
    main_out, other_out = ranks[0][case], ranks[1][case]
    assert other_out in ("", []), "only rank 0 writes files"
    want = single[script] if script == "sample" else single[script][-1]   # grid, or the contact sheet
    got = main_out if script == "sample" else main_out[-1]
    if script == "sample_video":
        assert len(main_out) == len(single[script]) == 4                   # 3 videos and the sheet
    assert_same_pixels(case, pixels(want), pixels(got))


@pytest.mark.parametrize("case", list(CACHED))
def test_two_cfg_parallel_ranks_with_a_step_cache_equal_one_process_with_it(outputs, case):
    single, ranks = outputs
    script = CACHED[case][0]
    last = (lambda out: out) if script == "sample" else (lambda out: out[-1])  # the grid, or the contact sheet
    want, uncached = pixels(last(single[case])), pixels(last(single[script]))
    assert not np.array_equal(want, uncached), f"{case}: the cache reused nothing"
    assert_same_pixels(case, want, pixels(last(ranks[0][case])))


@pytest.mark.parametrize("case", list(CASES_4))
def test_four_ranks_ring_and_usp_equal_one_process(outputs, case):
    single, _ = outputs
    script = CASES_4[case][0]
    want = single[script] if script == "sample" else single[script][-1]
    assert_same_pixels(case, pixels(want), spawn_results("sampling", 4)[0][case])


def assert_same_pixels(case, a, b):
    assert a.shape == b.shape
    # Bit-exact up to float reassociation across batch sizes: at most one 8-bit level, on few pixels.
    diff = np.abs(a - b)
    assert diff.max() <= 1 and (diff > 0).mean() < 1e-3, \
        f"{case}: max diff {diff.max()}, {(diff > 0).mean():.2%} of the pixels differ"
