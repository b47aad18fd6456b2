"""Joint image + video training through train_video.py with buckets: resume equals the
uninterrupted run, sequence parallelism over 2 ranks gives the serial loss (odd token counts per
frame), sampling at an untrained shape, bucket_batch=auto and the planner's command line."""

import os

import pytest
import torch

from tests.distributed import run_script_on_ranks
from tests.video_scripts.test_video_scripts import losses, run, weights

BUCKETS = ("data.buckets=[{frames: 2, height: 8, width: 8, batch_size: 2}, "
           "{name: wide, frames: 2, height: 10, width: 14, batch_size: 2}, "
           "{name: image, frames: 1, height: 8, width: 8, batch_size: 3, loss_weight: 0.5}]")
ARGS = ["--config", "configs/video_buckets_demo.yaml", "exp_name=b", "data.num_samples=18", "log_every=1", BUCKETS,
        "sample.num_sampling_steps=2", 'sample.prompts=["a red square moving right"]']


@pytest.mark.slow
def test_bucketed_run_resumes_exactly_and_samples_other_shapes(tmp_path):
    full, resumed = str(tmp_path / "full"), str(tmp_path / "resumed")
    proc = run(["train_video.py", *ARGS, f"results_dir={full}", "max_steps=4", "ckpt_every=2"])
    assert "image: 1x8x8 images, 6 samples, batch 3/rank" in proc.stdout + proc.stderr
    step2 = os.path.join(full, "b", "checkpoints", "b_step2")
    run(["train_video.py", *ARGS, f"results_dir={resumed}", "max_steps=4", f"resume_from={step2}"])
    want, got = weights(os.path.join(full, "b", "checkpoints", "b_step4")), \
        weights(os.path.join(resumed, "b", "checkpoints", "b_step4"))
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0, msg=f"weight {k} differs after resume")
    # An image and a shape no bucket had, from the same checkpoint.
    for extra in (["sample.num_frames=1"], ["sample.num_frames=3", "sample.height=12", "sample.width=8"]):
        proc = run(["sample_video.py", *ARGS, f"results_dir={full}", *extra,
                    f"sample.output_dir={tmp_path / extra[-1]}"])
        assert "contact_sheet.png" in proc.stdout


@pytest.mark.slow
def test_bucketed_sequence_parallel_matches_serial_loss(tmp_path):
    """sp_size=2 on 2 ranks: one data-parallel rank, the same batches on both ranks, 5x7 = 35 patches
    per frame in the wide bucket (not divisible by 2): the serial loss curve."""
    serial, sp = str(tmp_path / "serial"), str(tmp_path / "sp")
    run(["train_video.py", *ARGS, f"results_dir={serial}", "max_steps=3"])
    assert run_script_on_ranks("train_video.py", [*ARGS, f"results_dir={sp}", "max_steps=3", "sp_size=2"])[0][0] == 0
    torch.testing.assert_close(losses(os.path.join(sp, "b")), losses(os.path.join(serial, "b")), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_auto_bucket_batches_and_the_planner_command(tmp_path):
    # The default precision (auto: fp32 on this CPU) reaches the planner resolved, as the run trains.
    proc = run(["train_video.py", *ARGS, f"results_dir={tmp_path}", "max_steps=1", "bucket_batch=auto",
                "plan_memory_gb=1.2", "precision=auto"])  # ~80 MiB usable: more than the config's batch_size caps
    log = proc.stdout + proc.stderr
    assert "bucket_batch=auto" in log and "batch 3/rank" in log
    assert "activations in 4-byte elements" in log and "precision fp32" in log
    proc = run(["-m", "opendit_lite.plan", "--config", "configs/video_buckets_demo.yaml", "--gpu-memory", "2",
                "--world-size", "8"])
    for word in ("zero_degree=", "sp_size=", "selective_ratio=", "offload=", "square", "image", "assumptions"):
        assert word in proc.stdout
    bad = run(["-m", "opendit_lite.plan", "--config", "configs/video_buckets_demo.yaml", "--gpu-memory", "0.001"],
              check=False)
    assert bad.returncode == 2 and "no setting fits" in bad.stderr
