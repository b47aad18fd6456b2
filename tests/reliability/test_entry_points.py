"""Every entry point on one error path: train.py, train_video.py, sample.py, sample_video.py and
``python -m opendit_lite.evaluate`` read configs and files through the same checks, so each mistake
ends with exit code 2 and one paragraph naming the culprit, no traceback. One test per category;
most call ``main(argv)`` in this process (they fail before any model is built); the quiet start
runs two subprocesses, since what a new process prints is the point.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from tests.reliability.test_bad_inputs import (
    ROOT,
    TINY,
    VIDEO,
    assert_one_paragraph,
    run_main,
    scripts,  # noqa: F401  (the module-scoped fixture)
)

ENTRY_POINTS = {"train": TINY, "train_video": VIDEO, "sample": TINY, "sample_video": VIDEO, "evaluate": TINY}


@pytest.fixture(scope="module")
def entry(scripts):  # noqa: F811
    from opendit_lite.evaluate import __main__ as evaluate

    return {**scripts, "evaluate": evaluate}


def _config_with(args, path):
    """``args`` with its ``--config`` file replaced by ``path``."""
    args = list(args)
    args[args.index("--config") + 1] = str(path)
    return args


@pytest.fixture(scope="module")
def bad_configs(tmp_path_factory):
    root = tmp_path_factory.mktemp("configs")
    (root / "folder.yaml").mkdir()
    (root / "latin1.yaml").write_bytes("exp_name: caf\xe9\n".encode("latin-1"))
    (root / "list.yaml").write_text("- lr: 1e-4\n- max_steps: 2\n")
    return {"a folder": (root / "folder.yaml", "is a directory"),
            "not UTF-8": (root / "latin1.yaml", "is not UTF-8 text"),
            "a list": (root / "list.yaml", "must hold a mapping of keys to values at the top level")}


@pytest.mark.parametrize("name", list(ENTRY_POINTS))
@pytest.mark.parametrize("kind", ["a folder", "not UTF-8", "a list"])
def test_config_file_mistakes_on_every_entry_point(entry, bad_configs, capsys, tmp_path, name, kind):
    path, expected = bad_configs[kind]
    code, err = run_main(entry, capsys, name, *_config_with(ENTRY_POINTS[name], path), f"results_dir={tmp_path}")
    assert_one_paragraph(code, err, expected)
    assert str(path) in err


def _numeric_fields(cls, prefix=""):
    import dataclasses
    import typing

    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            yield from _numeric_fields(tp, prefix + f.name + ".")
            continue
        args = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
        inner = typing.get_args(args[0]) or args
        if inner[0] in (int, float):
            yield prefix + f.name, f


def test_every_numeric_field_declares_its_range():
    from opendit_lite.config import TrainConfig
    from opendit_lite.config.video_schema import VideoTrainConfig

    for schema in (TrainConfig, VideoTrainConfig):  # a field with a list of choices needs no range
        missing = [key for key, f in _numeric_fields(schema) if not {"range", "choices"} & set(f.metadata)]
        assert not missing, f"{schema.__name__}: numeric fields without at_least/at_most/above/below: {missing}"


@pytest.mark.parametrize("override, expected", [
    ("num_workers=-1", "'num_workers' must be >= 0; got -1."),
    ("lr=inf", "'lr' must be a finite number; got inf."),
    ("grad_clip=nan", "'grad_clip' must be a finite number; got nan."),
    ("data.image_size=-4", "'data.image_size' must be a positive integer; got -4."),
    ("sample.class_labels=[0,-3]", "'sample.class_labels' must be >= 0; got -3."),
    ("ema.decay=1.5", "'ema.decay' must lie in [0, 1]; got 1.5."),
    ("lora.dropout=1", "'lora.dropout' must lie in [0, 1); got 1.0."),
    ("eval.batch_size=0", "'eval.batch_size' must be a positive integer; got 0."),
])
def test_numbers_are_range_checked_in_one_place(override, expected):
    from opendit_lite.config import ConfigError, load_config

    with pytest.raises(ConfigError) as err:
        load_config(os.path.join(ROOT, "configs/demo.yaml"), [override])
    assert str(err.value).startswith(expected) and "Meaning of" in str(err.value)


def test_a_range_error_through_the_scripts(entry, capsys, tmp_path):
    code, err = run_main(entry, capsys, "train", *TINY, f"results_dir={tmp_path}", "num_workers=-1")
    assert_one_paragraph(code, err, "'num_workers' must be >= 0")
    code, err = run_main(entry, capsys, "train_video", *VIDEO, f"results_dir={tmp_path}", "plan_memory_gb=-1")
    assert_one_paragraph(code, err, "'plan_memory_gb' must be positive")


class Unsafe:
    """An object only pickle can restore (torch's weights_only loader refuses it)."""


def test_pickled_checkpoint_and_vae_are_refused(entry, capsys, tmp_path):
    """torch's weights_only refusal is exit 2 naming the file, for a checkpoint and a VAE alike."""
    from opendit_lite.encoders import load_vae
    from tests.tiny_assets import save_tiny_vae

    pickled = tmp_path / "model.pt"
    torch.save({"model": {"w": torch.zeros(1)}, "extra": Unsafe()}, pickled)
    code, err = run_main(entry, capsys, "sample", *TINY, f"results_dir={tmp_path}", f"sample.ckpt={pickled}")
    assert_one_paragraph(code, err, f"{pickled} holds pickled Python objects ({__name__}.Unsafe) besides tensors")
    code, err = run_main(entry, capsys, "train", *TINY, f"results_dir={tmp_path}", f"init_from={pickled}")
    assert_one_paragraph(code, err, "holds pickled Python objects")

    vae = tmp_path / "vae"
    save_tiny_vae(vae)
    for name in os.listdir(vae):
        if name.endswith(".safetensors"):
            os.remove(vae / name)
    torch.save({"state": Unsafe()}, vae / "diffusion_pytorch_model.bin")
    from opendit_lite.config import ConfigError

    with pytest.raises(ConfigError, match="'vae.path' .* cannot be loaded as an AutoencoderKL: its weights file "
                                          "holds pickled Python objects"):
        load_vae(str(vae))
    with pytest.raises(ConfigError, match="is not a folder with a config.json"):
        load_vae(str(tmp_path / "missing"))


def _fake_checkpoint(tmp_path, model_name, name="other_step1"):
    """A folder that looks like a checkpoint of ``model_name`` to the samplers (they check it first)."""
    ckpt = tmp_path / name
    ckpt.mkdir()
    (ckpt / "meta.json").write_text(json.dumps({"version": 1, "step": 1, "files": {},
                                                "extra_state": {"config": {"model": {"name": model_name}}}}))
    return ckpt


def test_samplers_refuse_a_checkpoint_of_another_model(entry, capsys, tmp_path):
    ckpt = _fake_checkpoint(tmp_path, "DiT-T/2")
    code, err = run_main(entry, capsys, "sample", *TINY, f"results_dir={tmp_path}", "model.name=DiT-S/2",
                         f"sample.ckpt={ckpt}")
    assert_one_paragraph(code, err, "the checkpoint is DiT-T/2, the config is DiT-S/2. Set model.name=DiT-T/2")
    video = _fake_checkpoint(tmp_path, "STDiT-tiny", "video_step1")
    code, err = run_main(entry, capsys, "sample_video", *VIDEO, f"results_dir={tmp_path}", "model.name=STDiT-XL/2",
                         f"sample.ckpt={video}")
    assert_one_paragraph(code, err, "the checkpoint is STDiT-tiny, the config is STDiT-XL/2")


def _latents(folder, shapes, meta):
    folder.mkdir()
    for i, shape in enumerate(shapes):
        save_file({"latents": torch.zeros(2, *shape), "labels": torch.tensor([0, 1])},
                  str(folder / f"shard_{i:05d}.safetensors"))
    if meta is not None:
        (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def test_latent_folders_are_checked_before_use(entry, capsys, tmp_path):
    meta = {"channels": 4, "height": 4, "width": 4, "classes": ["a", "b"]}
    cases = [
        (_latents(tmp_path / "mixed", [(4, 4, 4), (4, 2, 2)], meta), "hold latents of different shapes"),
        (_latents(tmp_path / "nosize", [(4, 4, 4)], {"classes": ["a", "b"]}), "lacks channels, height, width"),
        (_latents(tmp_path / "nometa", [(4, 4, 4)], None), "meta.json' is missing"),
        (_latents(tmp_path / "wrongmeta", [(4, 4, 4)], {**meta, "height": 8}), "but the shards hold latents of"),
    ]
    for folder, expected in cases:
        code, err = run_main(entry, capsys, "train", *TINY, f"results_dir={tmp_path}", "data.type=latents",
                             f"data.path={folder}")
        assert_one_paragraph(code, err, expected)
    # latents of the wrong shape for the model: named before the model's own traceback could happen
    folder = _latents(tmp_path / "good", [(4, 4, 4)], meta)
    code, err = run_main(entry, capsys, "train", *TINY, f"results_dir={tmp_path}", "data.type=latents",
                         f"data.path={folder}", "model.input_size=[8,8]")
    assert_one_paragraph(code, err, "are 4 x 4 x 4 (channels x height x width), but the model is set for 4 x 8 x 8")


def test_video_latents_and_prompt_files_are_checked(entry, capsys, tmp_path):
    from opendit_lite.config import ConfigError, load_config
    from opendit_lite.config.video_schema import VideoTrainConfig
    from opendit_lite.sampling.video import read_prompts

    folder = tmp_path / "video_latents"
    folder.mkdir()
    torch.save({"latents": torch.zeros(4, 2, 2, 2), "extra": Unsafe()}, folder / "00000000.pt")
    code, err = run_main(entry, capsys, "train_video", *VIDEO, f"results_dir={tmp_path}", "data.type=latents",
                         f"data.path={folder}")
    assert_one_paragraph(code, err, "cannot read video latents")
    prompts = tmp_path / "prompts.txt"
    prompts.write_bytes("a caf\xe9\n".encode("latin-1"))
    cfg = load_config(os.path.join(ROOT, "configs/video_stdit_demo.yaml"),
                      ["sample.prompts=null", f"sample.prompt_file={prompts}"], schema=VideoTrainConfig)
    with pytest.raises(ConfigError, match="cannot be read as UTF-8 text"):
        read_prompts(cfg)


def test_evaluate_checks_its_inputs_before_sampling(entry, capsys, tmp_path, monkeypatch):
    """Nothing is sampled when the Inception weights, the reference or the samples file are wrong."""
    import opendit_lite.evaluate.generate as generate
    from tests.evaluate.test_evaluate_command import random_inception_file

    monkeypatch.setattr(generate, "generate_samples", lambda *a, **k: pytest.fail("sampled before the checks"))
    flat = random_inception_file(tmp_path / "weights-inception-2015-12-05-6726825d.pth", informative=False)
    good = random_inception_file(tmp_path / "inception-random.pth")
    not_npz = tmp_path / "samples.npz"
    not_npz.write_text("not an archive")
    floats = tmp_path / "floats.npz"
    np.savez(floats, arr_0=np.zeros((2, 8, 8, 3), np.float32))
    stats = tmp_path / "stats.npz"
    np.savez(stats, mean=np.zeros(3))
    probes = [
        ([], "'eval.inception_path' is not set"),
        ([f"eval.inception_path={flat}"], "has InceptionV3's layout but not its weights"),
        ([f"eval.inception_path={good}", f"eval.samples={not_npz}"], "is not a readable .npz file"),
        ([f"eval.inception_path={good}", f"eval.samples={floats}"], "must be uint8 [N, H, W, 3] images"),
        ([f"eval.inception_path={good}", f"eval.reference={stats}"], "holds neither mu/sigma nor arr_0 images"),
        (["eval.score=false", f"eval.reference={stats}"], "'eval.score'=false only writes samples"),
    ]
    for extra, expected in probes:
        code, err = run_main(entry, capsys, "evaluate", *TINY, f"results_dir={tmp_path}", *extra)
        assert_one_paragraph(code, err, expected)


def test_video_csv_rows_without_a_caption_are_counted_loudly(tmp_path, capsys):
    from opendit_lite.data.video_csv import read_video_csv

    for name in ("a.mp4", "b.mp4"):
        (tmp_path / name).write_bytes(b"\0" * 8)  # listed and non-empty (decoding happens later)
    csv = tmp_path / "videos.csv"
    csv.write_text("path,text\na.mp4,a red square\nb.mp4,\n")
    assert [caption for _, caption in read_video_csv(str(csv))] == ["a red square", ""]
    assert f"warning: {csv}: 1 row(s) have an empty caption" in capsys.readouterr().err
    latin1 = tmp_path / "latin1.csv"
    latin1.write_bytes("path,text\na.mp4,caf\xe9\n".encode("latin-1"))
    with pytest.raises(ValueError, match="is not UTF-8 text"):
        read_video_csv(str(latin1))
    with pytest.raises(ValueError, match="is not a file"):
        read_video_csv(str(tmp_path))


def test_a_csv_folder_through_train_video(entry, capsys, tmp_path):
    code, err = run_main(entry, capsys, "train_video", *VIDEO, f"results_dir={tmp_path}", "data.type=csv",
                         f"data.path={tmp_path}")
    assert_one_paragraph(code, err, "is not a file: point data.path at a CSV file")


def test_torchrun_summary_names_the_error_printed_once(entry, capsys, tmp_path, monkeypatch):
    """Under torchrun every rank writes the paragraph to torch elastic's error file, which torchrun's
    failure summary prints (instead of its pointer to the traceback docs); only rank 0 prints it."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    import opendit_lite.utils.exit_codes as exit_codes

    monkeypatch.setattr(exit_codes, "ELASTIC_EXIT_DELAY_S", 0.0)
    files = {}
    for rank in (0, 1):
        files[rank] = tmp_path / f"error{rank}.json"
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(files[rank]))
        code, err = run_main(entry, capsys, "train", *TINY, f"results_dir={tmp_path}", "num_workers=-1")
        assert code == 2
        assert ("'num_workers' must be >= 0" in err) == (rank == 0), err
    failures = {rank: ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=2, error_file=str(path))
                for rank, path in files.items()}
    summary = ChildFailedError("train.py", failures).format_msg()
    assert summary.count("traceback : error (exit code 2): 'num_workers' must be >= 0") == 2, summary
    assert "To enable traceback" not in summary


def test_torchrun_prints_the_paragraph_once_and_its_summary_names_it(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "train.py", "--config", "configs/demo.yaml", f"results_dir={tmp_path}", "num_workers=-1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**QUIET_ENV, "OMP_NUM_THREADS": "1"})
    printed = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert printed == ["error: 'num_workers' must be >= 0; got -1. Meaning of num_workers: data-loader worker "
                       "processes per rank."], proc.stderr
    assert "traceback : error (exit code 2): 'num_workers' must be >= 0" in proc.stderr, proc.stderr
    assert "To enable traceback" not in proc.stderr and proc.returncode != 0


def test_fused_adaln_that_matches_nothing_names_the_protocol():
    import torch.nn as nn

    from opendit_lite.parallelization import apply_kernels

    with pytest.warns(UserWarning, match="adaln_norms / norm_modulate protocol"):
        apply_kernels(nn.Sequential(nn.Linear(4, 4)), fused_adaln=True)


def test_help_names_the_program(capsys):
    from opendit_lite.config import parse_cli

    with pytest.raises(SystemExit):
        parse_cli(["--help"], "Train.")
    usage = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("usage:"))
    assert usage.startswith("usage: python ") and usage.split()[2] not in ("[--config", ""), usage


def test_make_demo_is_rerunnable_and_clean_keeps_the_venv():
    makefile = subprocess.run(["make", "-n", "demo", "clean"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                              env={**os.environ, "MAKEFLAGS": ""})
    lines = [line for line in makefile.stdout.splitlines() if "train" in line or "rm " in line]
    assert any("train.py --config configs/demo.yaml auto_resume=true" in line for line in lines), makefile.stdout
    assert not any(".venv" in line for line in lines if line.startswith("rm ")), lines
    distclean = subprocess.run(["make", "-n", "distclean"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "rm -rf .venv" in distclean.stdout


def test_a_rerun_continues_says_so_and_samples_per_checkpoint(entry, capsys, tmp_path):
    """The demo's way (auto_resume=true) run twice: the first starts from step 0 and says so, the
    second finds the run complete and says there is nothing left to train; sample.py on a LoRA run
    says it merged the adapters, and samples of two checkpoints land in two files."""
    args = [*TINY, f"results_dir={tmp_path}", "exp_name=r", "max_steps=2", "ckpt_every=1", "auto_resume=true",
            "lora.rank=2", "lora.export_merged=false"]
    code, out = run_main(entry, capsys, "train", *args)
    assert code == 0 and "auto_resume: no checkpoint of experiment 'r' yet, starting from step 0" in out, out
    code, out = run_main(entry, capsys, "train", *args)
    assert code == 0 and "nothing left to train" in out and "r_step2 is at step 2 and max_steps=2" in out, out
    sample = [*TINY, f"results_dir={tmp_path}", "exp_name=r", "sample.num_sampling_steps=2",
              "sample.samples_per_class=1"]
    code, out = run_main(entry, capsys, "sample", *sample)
    assert code == 0 and "merged the LoRA adapters of" in out and "(rank 2, alpha 16)" in out, out
    first = tmp_path / "r" / "checkpoints" / "r_step1"
    code, out = run_main(entry, capsys, "sample", *sample, f"sample.ckpt={first}")
    assert code == 0, out
    assert sorted(os.listdir(tmp_path / "r" / "samples")) == ["r_step1.png", "r_step2.png"]


QUIET_ENV = {k: v for k, v in os.environ.items() if k not in ("OPENDIT_DEBUG", "PYTHONWARNINGS")}
NOISE = ("Warning", "warn", "deprecat", "Please install", "Failed to load", "kernels-community")


def _noise(stderr: str):
    return [line for line in stderr.splitlines() if any(word in line for word in NOISE)]


def test_quiet_start_import_and_a_tiny_run(tmp_path):
    """``import opendit_lite`` (with the entry points that pull in Colossal-AI) and a one-step
    train.py print no third-party warnings (--debug / OPENDIT_DEBUG=1 would let them through)."""
    code = "import opendit_lite; from opendit_lite import parallelize, OpenDiTPlugin, LiteGen"
    quiet = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=QUIET_ENV, capture_output=True, text=True,
                           timeout=300)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    run = subprocess.run([sys.executable, "train.py", *TINY, f"results_dir={tmp_path}", "max_steps=1",
                          "data.num_samples=8"], cwd=ROOT, env=QUIET_ENV, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert not _noise(run.stderr), run.stderr


def test_debug_keeps_third_party_warnings(monkeypatch):
    import warnings

    from opendit_lite.utils.quiet import quiet_third_party_startup

    monkeypatch.setenv("OPENDIT_DEBUG", "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_third_party_startup()
        warnings.warn("Please install apex from source (https://github.com/NVIDIA/apex)")
    assert len(caught) == 1
    monkeypatch.delenv("OPENDIT_DEBUG")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_third_party_startup()
        warnings.warn("Please install apex from source (https://github.com/NVIDIA/apex)")
    assert not caught
