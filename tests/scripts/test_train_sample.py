"""train.py and sample.py end to end on the embedded shapes data (tiny model, a few steps)."""

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
TINY = ["model.name=DiT-T/2", "data.image_size=16", "data.num_samples=64", "global_batch_size=8",
        "log_every=2", "sample.num_sampling_steps=4", "sample.samples_per_class=2"]


def run(script, *args, check=True, env=None):
    proc = run_script([os.path.join(ROOT, script), "--config", "configs/demo.yaml", *args], cwd=ROOT, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"{script} {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def model_weights(ckpt_dir):
    state = {}
    model_dir = os.path.join(ckpt_dir, "model")
    for name in sorted(os.listdir(model_dir)):
        if name.endswith(".safetensors"):
            state.update(load_file(os.path.join(model_dir, name)))
    return state


@pytest.mark.slow
def test_train_then_sample(tmp_path):
    out = str(tmp_path)
    run("train.py", f"results_dir={out}", "exp_name=e2e", "max_steps=4", "ckpt_every=2", *TINY)
    run_dir = os.path.join(out, "e2e")
    ckpts = sorted(os.listdir(os.path.join(run_dir, "checkpoints")))
    assert ckpts == ["e2e_step2", "e2e_step4"]
    records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert [r["step"] for r in records] == [2, 4] and all(r["loss"] > 0 for r in records)
    assert os.path.isdir(os.path.join(run_dir, "tensorboard"))

    grid = os.path.join(out, "grid.png")
    proc = run("sample.py", f"results_dir={out}", "exp_name=e2e", f"sample.output={grid}", *TINY)
    assert grid in proc.stdout
    first = open(grid, "rb").read()
    run("sample.py", f"results_dir={out}", "exp_name=e2e", f"sample.output={grid}", *TINY)
    assert open(grid, "rb").read() == first, "same seed must give the same images"


@pytest.mark.slow
def test_resume_equals_uninterrupted(tmp_path):
    """Train 2N steps == train N, stop, resume for N more (fp32, CPU: bit-identical weights and EMA)."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    run("train.py", f"results_dir={a}", "exp_name=r", "max_steps=6", *TINY)
    run("train.py", f"results_dir={b}", "exp_name=r", "max_steps=3", *TINY)
    run("train.py", f"results_dir={b}", "exp_name=r", "max_steps=6", "auto_resume=true", *TINY)
    ref = os.path.join(a, "r", "checkpoints", "r_step6")
    got = os.path.join(b, "r", "checkpoints", "r_step6")
    wa, wb = model_weights(ref), model_weights(got)
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=0, atol=0, msg=f"model weight {k} differs after resume")
    ea, eb = load_file(os.path.join(ref, "ema.safetensors")), load_file(os.path.join(got, "ema.safetensors"))
    for k in ea:
        torch.testing.assert_close(eb[k], ea[k], rtol=0, atol=0, msg=f"EMA weight {k} differs after resume")


@pytest.mark.parametrize("override, expected", [
    ("bogus_key=1", "Unknown config key 'bogus_key'"),
    ("zero_degree=7", "'zero_degree' must be one of 0, 1, 2, 3"),
    ("selective_ratio=1.5", "'selective_ratio' must lie in [0, 1]"),
    ("global_batch_size=7 grad_accum_steps=2", "'global_batch_size'=7 must be divisible"),
    ("data.type=image_folder data.path=/nonexistent/images", "'data.path' '/nonexistent/images' does not exist"),
    ("encoder.fsdp=true", "class-conditional train.py has none"),
    ("grad_precision=bf16", "'grad_precision'='bf16' is not supported"),
    ("sp_size=4 sp_mode=usp sp_ring_size=3", "'sp_ring_size'=3 must divide sp_size=4"),
    ("sp_size=2 sp_ring_size=2", "sets the ring degree of sp_mode=usp, but sp_mode is ulysses"),
    ("sp_mode=bogus", "'sp_mode' must be one of"),
])
def test_config_errors_exit_2_without_traceback(tmp_path, capsys, monkeypatch, override, expected):
    """In this process (each entry point's real exit code in a fresh interpreter: tests/reliability/
    test_fast_errors.py): every error is found before any process group starts."""
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(ROOT)
    import train

    with pytest.raises(SystemExit) as exit_info:
        train.main(["--config", "configs/demo.yaml", f"results_dir={tmp_path}", *override.split()])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert expected in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, "the message is one paragraph"


def image_configs():
    """The configs train.py takes (the others, video zoo models and diffusers families, are train_video.py's)."""
    import yaml

    from opendit_lite.builders.family import config_schema
    from opendit_lite.config import TrainConfig

    names = sorted(f for f in os.listdir(os.path.join(ROOT, "configs")) if f.endswith(".yaml"))
    return [f for f in names if config_schema(yaml.safe_load(open(os.path.join(ROOT, "configs", f)))) is TrainConfig]


@pytest.mark.parametrize("config", image_configs())
def test_every_config_rejects_unknown_key(config, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(ROOT)
    import train

    with pytest.raises(SystemExit) as exit_info:
        train.main(["--config", f"configs/{config}", "bogus_key=1"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Unknown config key 'bogus_key'" in err, err


def test_sample_from_original_dit_checkpoint(tmp_path):
    """sample.py takes a facebookresearch/DiT-style .pt ({'model', 'ema', 'args'} or a plain state dict)."""
    import argparse

    from opendit_lite.models import build_model

    model = build_model("DiT-T/2", input_size=16, in_channels=3, num_classes=8)
    pt = tmp_path / "dit.pt"
    torch.save({"model": model.state_dict(), "ema": model.state_dict(), "args": argparse.Namespace(lr=1e-4)}, pt)
    grid = tmp_path / "grid.png"
    run("sample.py", f"sample.ckpt={pt}", f"sample.output={grid}", "model.num_classes=8", "model.learn_sigma=true",
        "diffusion.objective=iddpm", "sample.sampler=ddpm", *TINY)
    assert grid.exists()


@pytest.mark.slow
def test_train_in_latent_space_with_a_local_vae(tmp_path):
    """An image folder encoded on the fly by a (tiny, randomly initialised) local AutoencoderKL."""
    from tests.tiny_assets import save_tiny_vae, write_image_folder

    save_tiny_vae(tmp_path / "vae")
    write_image_folder(tmp_path / "img", per_class=4, size=24)
    common = [f"results_dir={tmp_path}", "exp_name=vae", "data.type=image_folder", f"data.path={tmp_path / 'img'}",
              f"vae.path={tmp_path / 'vae'}", "model.name=DiT-T/2", "data.image_size=16", "global_batch_size=4",
              "log_every=1", "sample.num_sampling_steps=3", "sample.samples_per_class=1"]
    run("train.py", "max_steps=2", *common)
    saved = json.load(open(tmp_path / "vae" / "checkpoints" / "vae_step2" / "meta.json"))["extra_state"]["config"]
    assert saved["model"]["input_size"] == [8, 8] and saved["model"]["in_channels"] == 4
    run("sample.py", *common)
    assert (tmp_path / "vae" / "samples" / "vae_step2.png").exists()  # named after its checkpoint


@pytest.fixture(scope="module")
def serial_run(tmp_path_factory):
    """3 steps of DiT-T/2 in one plain process: the reference of the sequence-parallel runs."""
    out = tmp_path_factory.mktemp("serial")
    run("train.py", f"results_dir={out}", "exp_name=serial", "max_steps=3", "log_every=1", "ema.enable=false", *TINY)
    return out / "serial"


@pytest.mark.slow
@pytest.mark.parametrize("ranks, settings", [
    (2, ["sp_size=2", "selective_ratio=0.5"]),                       # Ulysses, half the blocks checkpointed
    (4, ["sp_size=4", "sp_mode=ring", "selective_ratio=0.5"]),       # one ring over 4 ranks
    (4, ["sp_size=4", "sp_mode=usp", "sp_ring_size=2"]),             # rings of 2 x Ulysses over 2
], ids=["ulysses", "ring", "usp"])
def test_sequence_parallel_ranks_match_one_process(serial_run, tmp_path, ranks, settings):
    """train.py on ranks at sp_size = ranks (one data-parallel rank; the ranks started as torchrun starts
    them) trains exactly like one plain process and saves the same weights: the SP mode, activation
    checkpointing and DDP compose. train.py under torchrun itself: tests/reliability (its summary, a
    full disk at 2 and 4 ranks, a SIGTERM to its ranks)."""
    common = [f"results_dir={tmp_path}", "max_steps=3", "log_every=1", "ema.enable=false", *TINY]
    codes = run_script_on_ranks("train.py", ["--config", "configs/demo.yaml", "exp_name=sp", *settings, *common],
                                world_size=ranks)
    assert [code for code, _ in codes] == [0] * ranks
    loss = {name: [json.loads(line)["loss"] for line in open(run_dir / "metrics.jsonl")]
            for name, run_dir in (("serial", serial_run), ("sp", tmp_path / "sp"))}
    assert loss["sp"] == pytest.approx(loss["serial"], rel=1e-5, abs=1e-6)
    wa = model_weights(serial_run / "checkpoints" / "serial_step3")
    wb = model_weights(tmp_path / "sp" / "checkpoints" / "sp_step3")
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-5, atol=1e-5, msg=f"weight {k} differs under SP")


@pytest.mark.parametrize("sig", ["SIGTERM"])
def test_stop_signal_is_honoured_at_the_next_step_with_a_checkpoint(tmp_path, sig):
    """A scheduler's SIGTERM (or Ctrl-C) loses nothing and waits for no log point: the run saves at
    the next step, exits with 130 well inside a grace period, and auto_resume continues from there."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "train.py", "--config", "configs/demo.yaml", f"results_dir={tmp_path}",
                             "exp_name=stop", "max_steps=100000", *TINY, "log_every=1000"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    while time.time() < deadline:  # wait until training runs (the progress bar shows steps)
        time.sleep(1.0)
        if proc.poll() is not None or (tmp_path / "stop" / "config.yaml").exists():
            break
    time.sleep(2.0)
    sent = time.time()
    proc.send_signal(getattr(signal, sig))
    out, err = proc.communicate(timeout=120)
    elapsed = time.time() - sent
    assert proc.returncode == 130, err
    assert elapsed < 60, f"took {elapsed:.0f} s to stop"
    assert "stop requested" in err + out and "Traceback" not in err
    ckpts = os.listdir(tmp_path / "stop" / "checkpoints")
    assert len(ckpts) == 1 and ckpts[0].startswith("stop_step")
    step = int(ckpts[0].rsplit("step", 1)[1])
    assert 0 < step < 1000  # not a log point (log_every=1000)
