"""Bad inputs through the scripts: each stops with exit code 2 and one paragraph, no traceback.

Most probes call the scripts' ``main(argv)`` in this process (they fail in validation or
pre-flight, before any model is built); a few run as subprocesses for the real exit codes.
Also here: a NaN at step k (exit 3, every earlier checkpoint finite and kept), bad data skipped.
"""

import importlib.util
import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.script_server import run_script
from tests.tiny_assets import write_image_folder

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--config", "configs/demo.yaml", "model.name=DiT-T/2", "data.image_size=16", "data.num_samples=32",
        "global_batch_size=8", "log_every=1", "ema.enable=false"]
VIDEO = ["--config", "configs/video_stdit_demo.yaml", "data.num_samples=16", "global_batch_size=4", "log_every=1"]


def _script(name):
    spec = importlib.util.spec_from_file_location(f"_script_{name}", os.path.join(ROOT, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def scripts():
    cwd = os.getcwd()
    os.chdir(ROOT)  # configs/ paths are relative to the repository
    try:
        yield {name: _script(name) for name in ("train", "train_video", "sample", "sample_video")}
    finally:
        os.chdir(cwd)


def run_main(scripts, capsys, name, *args):
    """(exit code, stdout + stderr) of ``<name>.py`` called in this process."""
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        scripts[name].main(list(args))
        code = 0
    except SystemExit as e:
        code = e.code
    finally:
        os.chdir(cwd)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def assert_one_paragraph(code, err, expected, want=2):
    assert code == want, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith(("error:", "stopped:"))]
    assert len(lines) == 1, err
    assert expected in lines[0], lines[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, scripts):
    """A 2-step image run with checkpoints at steps 1 and 2 (shared by the probes that need one)."""
    out = str(tmp_path_factory.mktemp("trained"))
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        scripts["train"].main([*TINY, f"results_dir={out}", "exp_name=t", "max_steps=2", "ckpt_every=1"])
    finally:
        os.chdir(cwd)
    return out


def _video_ckpt(tmp_path):
    """A folder that looks like a video-model checkpoint to the samplers and trainers."""
    ckpt = tmp_path / "v_step1"
    ckpt.mkdir()
    (ckpt / "meta.json").write_text(json.dumps({"version": 1, "step": 1, "files": {},
                                                "extra_state": {"config": {"model": {"name": "STDiT-tiny"}}}}))
    return str(ckpt)


IMAGE_PROBES = [
    ("lr=0", "'lr' must be positive"),
    ("keep_last=-1", "'keep_last' must be >= 0"),
    ("ckpt_every=-1", "'ckpt_every' must be >= 0"),
    ("exp_name=a/b", "'exp_name' 'a/b' must be a plain folder name"),
    ("sample.cfg_scale=-1", "'sample.cfg_scale' must be >= 0"),
    ("sample.samples_per_class=0", "'sample.samples_per_class' must be a positive integer"),
    ("max_bad_data_fraction=2", "'max_bad_data_fraction' must lie in [0, 1]"),
    ("model.name=DiT-Q/3", "'model.name' 'DiT-Q/3' is not a registered model"),
    ("model.name=STDiT-tiny", "is a video model"),
    ("resume_from=/nonexistent/ckpt", "'resume_from' '/nonexistent/ckpt' does not exist"),
    ("init_from=/nonexistent/w.pt", "'init_from' '/nonexistent/w.pt' does not exist"),
    ("nan_policy=maybe", "'nan_policy' must be one of"),
    ("data.image_size=15", "DiT-T/2 cannot take a model input of (15, 15)"),
    ("results_dir=/proc/forbidden", "Cannot write to '/proc/forbidden'"),
]


@pytest.mark.parametrize("override, expected", IMAGE_PROBES)
def test_train_probes(scripts, capsys, tmp_path, override, expected):
    args = [*TINY, f"results_dir={tmp_path}", override] if "results_dir" not in override else [*TINY, override]
    assert_one_paragraph(*run_main(scripts, capsys, "train", *args), expected)


def test_data_probes(scripts, capsys, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    code, err = run_main(scripts, capsys, "train", *TINY, f"results_dir={tmp_path}", "data.type=image_folder",
                         f"data.path={empty}")
    assert_one_paragraph(code, err, "is an empty folder")
    no_classes = tmp_path / "flat"
    no_classes.mkdir()
    (no_classes / "x.txt").write_text("not an image")
    code, err = run_main(scripts, capsys, "train", *TINY, f"results_dir={tmp_path}", "data.type=image_folder",
                         f"data.path={no_classes}")
    assert_one_paragraph(code, err, "no images found")
    bad_latents = tmp_path / "latents"
    bad_latents.mkdir()
    (bad_latents / "shard_00000.safetensors").write_bytes(b"garbage")
    code, err = run_main(scripts, capsys, "train", *TINY, f"results_dir={tmp_path}", "data.type=latents",
                         f"data.path={bad_latents}")
    assert_one_paragraph(code, err, "cannot read latent shard")
    labels = tmp_path / "labels"
    labels.mkdir()
    save_file({"latents": torch.zeros(4, 4, 2, 2), "labels": torch.tensor([0, 1, 2, 1])},
              str(labels / "shard_00000.safetensors"))
    (labels / "meta.json").write_text(json.dumps({"classes": ["a", "b"], "channels": 4, "height": 2, "width": 2}))
    code, err = run_main(scripts, capsys, "train", *TINY, f"results_dir={tmp_path}", "data.type=latents",
                         f"data.path={labels}")
    assert_one_paragraph(code, err, "holds label 2, outside 0..1")
    assert "shard_00000.safetensors" in err


def test_checkpoint_probes(scripts, capsys, trained, tmp_path):
    ckpts = os.path.join(trained, "t", "checkpoints")
    # a fresh run into a folder holding checkpoints
    code, err = run_main(scripts, capsys, "train", *TINY, f"results_dir={trained}", "exp_name=t", "max_steps=2")
    assert_one_paragraph(code, err, "resume with auto_resume=true, or choose another exp_name / results_dir")
    # a model-size mismatch names both models
    code, err = run_main(scripts, capsys, "train", *TINY, f"results_dir={tmp_path}", "model.name=DiT-S/2",
                         f"resume_from={ckpts}/t_step2")
    assert_one_paragraph(code, err, "the checkpoint is DiT-T/2, the config is DiT-S/2")
    # a folder that is not a complete checkpoint
    code, err = run_main(scripts, capsys, "train", *TINY, f"results_dir={tmp_path}", f"resume_from={tmp_path}")
    assert_one_paragraph(code, err, "is not a complete checkpoint folder")
    # sample.py given a video checkpoint, and a missing one
    video = _video_ckpt(tmp_path)
    code, err = run_main(scripts, capsys, "sample", *TINY, f"results_dir={tmp_path}", f"sample.ckpt={video}")
    assert_one_paragraph(code, err, "holds STDiT-tiny, which is a video model (it declares is_video = True): use "
                                    "sample_video.py. sample.py samples image models")
    code, err = run_main(scripts, capsys, "sample", *TINY, f"results_dir={tmp_path}", "sample.ckpt=/nonexistent")
    assert_one_paragraph(code, err, "'sample.ckpt' '/nonexistent' does not exist")
    # sample_video.py given an image checkpoint
    code, err = run_main(scripts, capsys, "sample_video", *VIDEO, f"results_dir={tmp_path}",
                         f"sample.ckpt={ckpts}/t_step2")
    assert_one_paragraph(code, err, "holds DiT-T/2, which is an image model")
    # train_video.py with an image model or an image checkpoint
    code, err = run_main(scripts, capsys, "train_video", *VIDEO, f"results_dir={tmp_path}", "model.name=DiT-T/2")
    assert_one_paragraph(code, err, "is an image model (it declares is_video = False): use train.py")
    code, err = run_main(scripts, capsys, "train_video", *VIDEO, f"results_dir={tmp_path}",
                         f"resume_from={ckpts}/t_step2")
    assert_one_paragraph(code, err, "the checkpoint is DiT-T/2, the config is STDiT-tiny")


def test_auto_resume_walks_back_past_a_corrupted_checkpoint(scripts, capsys, trained, tmp_path):
    import shutil

    out = str(tmp_path / "copy")
    shutil.copytree(trained, out)
    shard = next(p for p in sorted((tmp_path / "copy" / "t" / "checkpoints" / "t_step2" / "model").iterdir())
                 if p.suffix == ".safetensors")
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    code, err = run_main(scripts, capsys, "train", *TINY, f"results_dir={out}", "exp_name=t", "max_steps=3",
                         "auto_resume=true")
    assert code == 0, err
    assert "skipping" in err and "t_step2" in err and "corrupted" in err, err
    assert "resumed from" in err and "t_step1 at step 1" in err, err


def inject_nan(monkeypatch, at_call):
    """Make the trainer's loss NaN on the micro-batches for which ``at_call(n)`` (n counts from 1)."""
    from opendit_lite.training import trainer

    calls = {"n": 0}
    real = trainer.objective_loss

    def loss_with_nan(*args, **kwargs):
        calls["n"] += 1
        loss = real(*args, **kwargs)
        return loss * float("nan") if at_call(calls["n"]) else loss

    monkeypatch.setattr(trainer, "objective_loss", loss_with_nan)


def test_nan_at_step_k_stops_with_exit_3_keeping_finite_checkpoints(scripts, capsys, tmp_path, monkeypatch):
    inject_nan(monkeypatch, lambda n: n >= 3)
    code, err = run_main(scripts, capsys, "train", *TINY, f"results_dir={tmp_path}", "exp_name=n", "max_steps=6",
                         "ckpt_every=1", "keep_last=2", "log_every=5")
    assert_one_paragraph(code, err, "at step 3", want=3)
    root = tmp_path / "n" / "checkpoints"
    assert sorted(os.listdir(root)) == ["n_step1", "n_step2"]
    for name in os.listdir(root):
        for shard in (root / name / "model").iterdir():
            if shard.suffix == ".safetensors":
                assert all(torch.isfinite(v).all() for v in load_file(str(shard)).values())


def test_undecodable_image_is_skipped_with_a_warning(scripts, capsys, tmp_path):
    folder = write_image_folder(tmp_path / "images", per_class=4, size=20)
    broken = os.path.join(folder, "a", "1.png")
    with open(broken, "r+b") as f:
        f.truncate(60)  # a truncated PNG
    code, err = run_main(scripts, capsys, "train", *TINY, f"results_dir={tmp_path}", "data.type=image_folder",
                         f"data.path={folder}", "max_steps=2", "global_batch_size=4", "max_bad_data_fraction=0.5")
    assert code == 0, err
    assert f"skipping {broken}" in err and "Traceback" not in err
    code, err = run_main(scripts, capsys, "train", *TINY, f"results_dir={tmp_path}", "exp_name=strict",
                         "data.type=image_folder", f"data.path={folder}", "max_steps=2", "global_batch_size=4",
                         "max_bad_data_fraction=0")
    assert_one_paragraph(code, err, "failed to decode")


def test_debug_shows_the_traceback(scripts, capsys, tmp_path):
    code, err = run_main(scripts, capsys, "train", *TINY, f"results_dir={tmp_path}", "resume_from=/nonexistent",
                         "--debug")
    assert code == 2 and "Traceback" in err and "'resume_from' '/nonexistent' does not exist" in err


def test_real_exit_code_in_a_subprocess(tmp_path):
    proc = run_script(["train.py", *TINY, f"results_dir={tmp_path}", "resume_from=/nonexistent"], cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: 'resume_from' '/nonexistent' does not exist. Point it at a checkpoint folder "
        "(<results_dir>/<exp_name>/checkpoints/<exp_name>_step<N>), or use auto_resume=true."]


def test_skip_step_policy_drops_a_nan_batch_and_finishes(scripts, capsys, tmp_path, monkeypatch):
    inject_nan(monkeypatch, lambda n: n == 2)
    code, out = run_main(scripts, capsys, "train", *TINY, f"results_dir={tmp_path}", "exp_name=s", "max_steps=3",
                         "nan_policy=skip_step")
    assert code == 0, out
    assert "skipped the update of step 2" in out
    assert os.listdir(tmp_path / "s" / "checkpoints") == ["s_step3"]
