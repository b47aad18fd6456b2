"""train_video.py and sample_video.py end to end on the embedded moving-shapes clips (tiny models,
a few steps): STDiT with rectified flow, Vchitect with IDDPM, resume, sequence parallelism under
torchrun (Ulysses, DSP) against the serial loss, and config errors."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.distributed import run_script_on_ranks
from tests.script_server import run_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["data.num_samples=16", "global_batch_size=4", "log_every=1", "data.image_size=8",
        "sample.num_sampling_steps=2", 'sample.prompts=["a red square moving right","a blue disc moving up"]']
STDIT = ["--config", "configs/video_stdit_demo.yaml"]
VCHITECT = ["--config", "configs/video_vchitect_demo.yaml", "diffusion.objective=iddpm", "model.learn_sigma=true",
            "sample.sampler=ddim"]


def run(args, check=True, torchrun=False):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if torchrun:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        proc = subprocess.run(launcher + args, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    else:
        proc = run_script(args, cwd=ROOT, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def losses(run_dir):
    return [json.loads(line)["loss"] for line in open(os.path.join(run_dir, "metrics.jsonl"))]


def weights(ckpt):
    model_dir = os.path.join(ckpt, "model")
    state = {}
    for name in sorted(os.listdir(model_dir)):
        if name.endswith(".safetensors"):
            state.update(load_file(os.path.join(model_dir, name)))
    return state


@pytest.fixture(scope="module")
def stdit_run(tmp_path_factory):
    """STDiT-tiny, rectified flow, 4 steps with a checkpoint at step 2."""
    out = str(tmp_path_factory.mktemp("stdit"))
    run(["train_video.py", *STDIT, f"results_dir={out}", "exp_name=s", "max_steps=4", "ckpt_every=2", *TINY])
    return out


def sample_twice(config, out, sheet_dir_a, sheet_dir_b):
    """Run sample_video.main twice in one process (one start-up) and return both path lists."""
    code = ("import json, sys, sample_video; a, b, rest = sys.argv[1], sys.argv[2], sys.argv[3:]; "
            "print(json.dumps([sample_video.main(rest + [f'sample.output_dir={d}']) for d in (a, b)]))")
    proc = run(["-c", code, sheet_dir_a, sheet_dir_b, *config, f"results_dir={out}", *TINY])
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stdout


def check_samples(paths_a, paths_b, stdout):
    videos, sheet = paths_a[:-1], paths_a[-1]
    assert len(videos) == 2 and all(p.endswith((".mp4", ".gif")) and os.path.getsize(p) > 0 for p in videos)
    assert sheet.endswith("contact_sheet.png") and all(p in stdout for p in paths_a)
    assert open(sheet, "rb").read() == open(paths_b[-1], "rb").read(), "same seed must give the same videos"


def test_stdit_rflow_train_then_sample(stdit_run, tmp_path):
    run_dir = os.path.join(stdit_run, "s")
    assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == ["s_step2", "s_step4"]
    assert len(losses(run_dir)) == 4 and all(v > 0 for v in losses(run_dir))
    (paths_a, paths_b), stdout = sample_twice([*STDIT, "exp_name=s"], stdit_run, str(tmp_path / "a"),
                                              str(tmp_path / "b"))
    check_samples(paths_a, paths_b, stdout)


def test_vchitect_iddpm_train_then_sample(tmp_path):
    out = str(tmp_path)
    run(["train_video.py", *VCHITECT, f"results_dir={out}", "exp_name=v", "max_steps=2", *TINY])
    (paths_a, paths_b), stdout = sample_twice([*VCHITECT, "exp_name=v"], out, str(tmp_path / "a"), str(tmp_path / "b"))
    check_samples(paths_a, paths_b, stdout)


def test_resume_equals_uninterrupted(stdit_run, tmp_path):
    """Steps 3-4 resumed from the step-2 checkpoint give the uninterrupted run's weights bit for bit."""
    step2 = os.path.join(stdit_run, "s", "checkpoints", "s_step2")
    run(["train_video.py", *STDIT, f"results_dir={tmp_path}", "exp_name=s", "max_steps=4", f"resume_from={step2}",
         *TINY])
    want, got = weights(os.path.join(stdit_run, "s", "checkpoints", "s_step4")), \
        weights(os.path.join(tmp_path, "s", "checkpoints", "s_step4"))
    assert want.keys() == got.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0, msg=f"weight {k} differs after resume")


@pytest.mark.parametrize("mode", ["ulysses", "dsp"])
def test_sequence_parallel_matches_serial_loss(stdit_run, tmp_path, mode):
    """sp_size=2 over 2 ranks is one data-parallel rank, so the loss curve is the serial run's (the ranks
    started as torchrun starts them; train_video.py's torchrun smoke test is in test_family_scripts.py)."""
    codes = run_script_on_ranks("train_video.py", [*STDIT, f"results_dir={tmp_path}", "exp_name=s", "max_steps=4",
                                                   "sp_size=2", f"sp_mode={mode}", *TINY])
    assert [code for code, _ in codes] == [0, 0]
    torch.testing.assert_close(losses(os.path.join(tmp_path, "s")), losses(os.path.join(stdit_run, "s")),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("override, expected", [
    (["bogus_key=1"], "Unknown config key 'bogus_key'"),
    (["--config", "configs/video_vchitect_demo.yaml", "sp_size=2", "sp_mode=dsp"],
     "sp_mode=dsp is not supported by VchitectXL"),
    (["data.type=shapes", "text_encoder.kind=t5"], "text_encoder.kind must be 'shapes'"),
    (["data.type=latents"], "'data.path' is required for data.type='latents'"),
    (["diffusion.objective=ddpm"], "'diffusion.objective' must be one of 'rflow', 'vpred', 'iddpm'"),
])
def test_config_errors_exit_2(tmp_path, capsys, override, expected):
    """Checked before any process group starts, so the entry point runs in this process (no start-up cost)."""
    sys.path.insert(0, ROOT)
    try:
        import train_video
    finally:
        sys.path.remove(ROOT)
    args = override if override[0] == "--config" else [*STDIT, *override]
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with pytest.raises(SystemExit) as exit_info:
            train_video.main([*args, f"results_dir={tmp_path}"])
    finally:
        os.chdir(cwd)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and expected in err, err


def test_image_model_name_is_refused():
    from opendit_lite.builders.video import build_video_model
    from opendit_lite.config import ConfigError, load_config
    from opendit_lite.config.video_schema import VideoTrainConfig

    cfg = load_config(None, ["model.name=DiT-S/2", "model.in_channels=3", "model.caption_channels=32"],
                      schema=VideoTrainConfig)
    with pytest.raises(ConfigError, match="is an image model"):
        build_video_model(cfg)
