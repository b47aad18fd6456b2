"""Fast errors: every entry point reads and checks its config and options before it imports torch,
timm or Colossal-AI (seconds), so a config error (an unknown key, a bad value, a bad type, a missing
file) ends with exit code 2 and one paragraph in a fraction of a second. Then the bad inputs that
used to end in a traceback after start-up, or to pass without a word, each stopped up front.

The speed is checked two ways: each entry point's error takes less than a generous bound in a new
interpreter, and (independent of the machine's speed) every kind of config error ends in an
interpreter where importing torch fails.
"""

import json
import os
import subprocess
import sys
import time

import pytest

from opendit_lite.checkpoint.catalog import read_meta
from opendit_lite.checkpoint.layout import saved_config
from opendit_lite.data.video_csv import read_video_csv
from opendit_lite.errors import CheckpointError
from tests.reliability.test_bad_inputs import (  # noqa: F401  (scripts, trained: module-scoped fixtures)
    ROOT,
    TINY,
    VIDEO,
    assert_one_paragraph,
    run_main,
    scripts,
    trained,
)

BOUND_S = 4.0  # generous: about 0.3 s on two idle cores; importing torch, timm and Colossal-AI takes 8-11 s

# entry point -> (how it is started, the arguments every case adds, the cases: arguments -> what the error says)
ENTRY_POINTS = {
    "train.py": ("train.py", ["--config", "configs/demo.yaml"], {}),
    "train_video.py": ("train_video.py", ["--config", "configs/video_stdit_demo.yaml"], {}),
    "sample.py": ("sample.py", ["--config", "configs/demo.yaml"], {}),
    "sample_video.py": ("sample_video.py", ["--config", "configs/video_stdit_demo.yaml"], {}),
    "plan": ("-m opendit_lite.plan", ["--config", "configs/demo.yaml", "--gpu-memory", "80"], {  # reads no data
        ("bogus_key=1",): "Unknown config key 'bogus_key'",
        ("zero_degree=5",): "'zero_degree' must be one of",
        ("--gpu-memory", "lots"): "the memory per device (GiB) must be a number, got 'lots'",
        ("--config", "/nonexistent.yaml"): "Config file '/nonexistent.yaml' does not exist",
        ("--config", "configs/flux_lora.yaml"): "'model.pipeline' '/path/to/FLUX.1-dev' is not a folder",
    }),
    "evaluate": ("-m opendit_lite.evaluate", ["--config", "configs/demo.yaml"], {}),
    "extract_latents": ("scripts/extract_latents.py", ["--output", "/nonexistent/latents"], {
        ("--bogus",): "unrecognized arguments: --bogus",
        ("--family", "wan", "--csv", "configs/demo.yaml", "--num-frames", "0"): "--num-frames must be at least 1",
        ("--batch-size", "many"): "argument --batch-size: invalid int value",
        ("--config", "/nonexistent.yaml"): "Config file '/nonexistent.yaml' does not exist",
        ("--output", "configs/demo.yaml/latents"): "configs/demo.yaml' is a file, not a folder",
        ("--pipeline", "configs", "--csv", "configs/demo.yaml"): "'model.pipeline' 'configs' holds no model_index.json",
    }),
    "export_diffusers": ("scripts/export_diffusers.py", ["--output", "/nonexistent/out"], {
        ("--checkpoint", "x", "--bogus"): "unrecognized arguments: --bogus",
        ("--checkpoint", "x", "--lora", "all"): "argument --lora: invalid choice: 'all'",
        ("--from-diffusers", "x", "--no-ema"):
            "--vae, --no-ema, --allow-inexact, --lora and --lora-format apply to --checkpoint",
        ("--checkpoint", "/nonexistent/ckpt"): "--checkpoint '/nonexistent/ckpt' is not a folder",
        ("--from-diffusers", "x", "--output", "configs/demo.yaml/x.safetensors"): "configs/demo.yaml' is a file",
    }),
    "make_tiny_pipeline": ("scripts/make_tiny_pipeline.py", ["--out", "/tmp/opendit_lite_never_written/tiny"], {
        # an unknown --family is named after the families are imported: tests/scripts/test_make_tiny_pipeline.py
        ("--family", "flux", "--bogus"): "unrecognized arguments: --bogus",
        ("--family", "flux", "--seed", "x"): "argument --seed: invalid int value",
        ("--family", "flux", "--out", "configs/demo.yaml/tiny"): "configs/demo.yaml' is a file, not a folder",
    }),
}
# The config errors every config-reading entry point is checked for.
CONFIG_CASES = {
    ("bogus_key=1",): "Unknown config key 'bogus_key'",
    ("zero_degree=5",): "'zero_degree' must be one of",
    ("lr=fast",): "'lr' must be",
    ("data.path=/nonexistent/data",): "'data.path' '/nonexistent/data' does not exist",
    ("--config", "/nonexistent.yaml"): "Config file '/nonexistent.yaml' does not exist",
}


def _command(start: str, args):
    return [sys.executable, *start.split(), *args]


def _cases(name):
    start, common, cases = ENTRY_POINTS[name]
    return start, common, cases or CONFIG_CASES


@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_a_config_error_ends_in_a_fraction_of_a_second(name):
    start, common, cases = _cases(name)
    args = [*common, *next(iter(cases))]
    began = time.perf_counter()
    proc = subprocess.run(_command(start, args), cwd=ROOT, capture_output=True, text=True, timeout=60)
    took = time.perf_counter() - began
    assert_one_paragraph(proc.returncode, proc.stderr, next(iter(cases.values())))
    assert took < BOUND_S, f"{name}: a config error took {took:.1f} s (bound {BOUND_S} s)"


# Runs an entry point once per case in one interpreter where "import torch" fails; prints
# [[exit code, stderr], ...] as JSON.
_WITHOUT_TORCH = r"""
import contextlib, io, json, runpy, sys
sys.modules["torch"] = None  # importing torch now raises: every case must end before it
start, common, cases = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
results = []
for args in cases:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            if start.startswith("-m "):
                sys.argv = [start[3:], *common, *args]
                runpy.run_module(start[3:], run_name="__main__", alter_sys=True)
            else:
                sys.argv = [start, *common, *args]
                runpy.run_path(start, run_name="__main__")
            code = 0
        except SystemExit as e:
            code = e.code
        except BaseException as e:
            code = f"{type(e).__name__}: {e}"
    results.append([code, err.getvalue()])
print(json.dumps(results))
"""


@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_config_errors_end_before_torch_is_imported(name):
    start, common, cases = _cases(name)
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_TORCH, start, json.dumps(common),
                           json.dumps([list(args) for args in cases])], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(proc.stdout.splitlines()[-1])
    for (args, expected), (code, err) in zip(cases.items(), results, strict=True):
        assert code == 2, (name, args, code, err)  # an import of torch would show as ModuleNotFoundError
        assert_one_paragraph(code, err, expected)


# Runs an entry point with --help in an interpreter that notes, at the first import of the config
# package or of torch, whether SIGTERM has a handler yet; prints [module, handled] as JSON.
_HANDLER_FIRST = r"""
import importlib.abc, json, runpy, signal, sys
first = []

class Probe(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if not first and name in ("opendit_lite.config", "torch"):
            first.append([name, signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)])
        return None

sys.meta_path.insert(0, Probe())
start = sys.argv[1]
try:
    if start.startswith("-m "):
        sys.argv = [start[3:], "--help"]
        runpy.run_module(start[3:], run_name="__main__", alter_sys=True)
    else:
        sys.argv = [start, "--help"]
        runpy.run_path(start, run_name="__main__")
except SystemExit:
    pass
print(json.dumps(first[0] if first else None))
"""


@pytest.mark.parametrize("name", [*ENTRY_POINTS, "launch"])
def test_each_entry_point_puts_its_stop_handler_in_place_before_its_imports(name):
    """A Ctrl-C or SIGTERM while an entry point reads its config or imports torch ends it with one line
    and exit code 130: the handler is in place before the first of those imports."""
    start = ENTRY_POINTS[name][0] if name in ENTRY_POINTS else "-m opendit_lite.launch"
    proc = subprocess.run([sys.executable, "-c", _HANDLER_FIRST, start], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr
    module, handled = json.loads(proc.stdout.splitlines()[-1])
    assert handled, f"{name}: SIGTERM has no handler yet when {module} is imported"


# --------------------------------------------------------------------------------------------------
# Checked up front: what used to end in a traceback after start-up, or pass without a word
# --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def list_sections(tmp_path_factory):
    root = tmp_path_factory.mktemp("sections")
    (root / "model_list.yaml").write_text("model:\n  - name: DiT-T/2\ndata:\n  image_size: 16\n")
    (root / "ema_number.yaml").write_text("ema: 0.999\n")
    return root


def test_a_section_given_as_a_list_is_refused_even_when_an_override_sets_it(scripts, capsys, list_sections):  # noqa: F811
    path = list_sections / "model_list.yaml"
    code, err = run_main(scripts, capsys, "train", "--config", str(path), "model.name=DiT-T/2")
    assert_one_paragraph(code, err, f"'model' must be a mapping of keys to values (a section), but config file "
                                    f"'{path}' gives it a list")
    path = list_sections / "ema_number.yaml"
    code, err = run_main(scripts, capsys, "train", "--config", str(path))
    assert_one_paragraph(code, err, f"'ema' must be a mapping of keys to values (a section), but config file "
                                    f"'{path}' gives it the float 0.999")
    code, err = run_main(scripts, capsys, "train", "--config", "configs/demo.yaml", "model=DiT-T/2")
    assert_one_paragraph(code, err, "'model' must be a mapping of keys to values (a section), but the command line "
                                    "gives it the str 'DiT-T/2'")


def test_the_planner_refuses_a_list_section(capsys, list_sections):
    from opendit_lite.plan.__main__ import main as plan_main

    for extra in ([], ["model.name=DiT-T/2"]):
        with pytest.raises(SystemExit) as info:
            plan_main(["--config", str(list_sections / "model_list.yaml"), "--gpu-memory", "80", *extra])
        assert_one_paragraph(info.value.code, capsys.readouterr().err, "'model' must be a mapping of keys to values")


def test_the_planner_refuses_settings_it_is_told_to_keep_that_cannot_start(capsys):
    from opendit_lite.plan.__main__ import main as plan_main

    with pytest.raises(SystemExit) as info:
        plan_main(["--config", "configs/video_stdit_demo.yaml", "--gpu-memory", "80", "--world-size", "3",
                   "--keep-settings", "sp_size=2"])
    assert_one_paragraph(info.value.code, capsys.readouterr().err, "'sp_size'=2 must divide the number of ranks (3)")


@pytest.mark.parametrize("name, override, expected", [
    ("sample", "sample.class_labels=[]", "'sample.class_labels' is an empty list"),
    ("sample_video", "sample.prompts=[]", "'sample.prompts' is an empty list"),
    ("train", "lora.targets=[]", "'lora.targets' is an empty list"),
])
def test_an_empty_list_is_refused_where_null_means_the_default(scripts, capsys, tmp_path, name, override, expected):  # noqa: F811
    args = TINY if name in ("sample", "train") else VIDEO
    code, err = run_main(scripts, capsys, name, *args, override, f"results_dir={tmp_path}")
    assert_one_paragraph(code, err, expected)


def test_an_output_path_under_a_file_is_refused_before_sampling(scripts, capsys, tmp_path):  # noqa: F811
    from opendit_lite.evaluate import __main__ as evaluate

    blocker = tmp_path / "a_file"
    blocker.write_text("")
    cases = [("sample", TINY, f"sample.output={blocker}/grid.png", f"'sample.output' '{blocker}/grid.png' cannot be "
                                                                   f"written: '{blocker}' is a file, not a folder"),
             ("sample_video", VIDEO, f"sample.output_dir={blocker}", f"'sample.output_dir' '{blocker}' is a file"),
             ("sample", TINY, f"results_dir={blocker}", f"'results_dir' '{blocker}/demo' cannot be written"),
             ("evaluate", TINY, f"eval.output_dir={blocker}/eval", f"'eval.output_dir' '{blocker}/eval' cannot be")]
    for name, args, override, expected in cases:
        code, err = run_main({**scripts, "evaluate": evaluate}, capsys, name, *args, override)
        assert_one_paragraph(code, err, expected)


def _negative_step(trained, tmp_path):  # noqa: F811
    ckpt = tmp_path / "neg_step2"
    import shutil

    shutil.copytree(os.path.join(trained, "t", "checkpoints", "t_step2"), ckpt)
    meta = json.loads((ckpt / "meta.json").read_text())
    (ckpt / "meta.json").write_text(json.dumps(dict(meta, step=-3)))
    return str(ckpt)


def test_a_checkpoint_whose_meta_has_a_negative_step_is_refused(scripts, capsys, trained, tmp_path):  # noqa: F811
    ckpt = _negative_step(trained, tmp_path)
    for read in (read_meta, saved_config):
        with pytest.raises(CheckpointError, match="meta.json is damaged: its 'step' is -3, not a step >= 0"):
            read(ckpt)
    code, err = run_main(scripts, capsys, "train", *TINY, f"resume_from={ckpt}", f"results_dir={tmp_path}")
    assert_one_paragraph(code, err, "its 'step' is -3, not a step >= 0")
    code, err = run_main(scripts, capsys, "sample", *TINY, f"sample.ckpt={ckpt}", f"results_dir={tmp_path}")
    assert_one_paragraph(code, err, "its 'step' is -3, not a step >= 0. Point resume_from")


@pytest.mark.parametrize("name, args, override, expected", [
    ("train", TINY, "model.in_channels=4", "The images in pixel space (no vae.path), data.image_size=16 RGB, are "
                                           "3 x 16 x 16 (channels x height x width), but the model is set for 4 x 16 "
                                           "x 16 (model.in_channels, model.input_size)"),
    ("train", TINY, "model.input_size=[8]", "but the model is set for 3 x 8 x 8"),
    ("train_video", VIDEO, "model.in_channels=4", "model.in_channels=4, but the clips in pixel space (no vae.path) "
                                                  "have 3 channels"),
])
def test_a_model_that_does_not_fit_the_data_is_refused_before_it_is_built(scripts, capsys, tmp_path, name,  # noqa: F811
                                                                          args, override, expected):
    code, err = run_main(scripts, capsys, name, *args, override, "max_steps=1", f"results_dir={tmp_path}")
    assert_one_paragraph(code, err, expected)


def test_csv_rows_without_a_caption_are_named(tmp_path, capsys):
    video = tmp_path / "clip.mp4"
    video.write_bytes(b"not decoded by the scan")
    rows = [("clip.mp4", "a red disc"), ("clip.mp4", ""), ("clip.mp4", "  "), ("clip.mp4", "a blue square")]
    (tmp_path / "clips.csv").write_text("path,text\n" + "".join(f"{p},{t}\n" for p, t in rows))
    assert len(read_video_csv(str(tmp_path / "clips.csv"))) == 4
    err = capsys.readouterr().err
    assert "2 row(s) have an empty caption, on line(s) 3, 4; they train as the empty caption" in err, err
    (tmp_path / "none.csv").write_text("path,text\nclip.mp4,\n")
    read_video_csv(str(tmp_path / "none.csv"))
    assert "(every row: is the caption column named 'text'?)" in capsys.readouterr().err


def test_init_from_a_folder_without_weights_is_refused_up_front(scripts, capsys, tmp_path):  # noqa: F811
    (tmp_path / "empty").mkdir()
    code, err = run_main(scripts, capsys, "train", *TINY, f"init_from={tmp_path / 'empty'}", f"results_dir={tmp_path}")
    assert_one_paragraph(code, err, f"'init_from' '{tmp_path / 'empty'}' is a folder without .safetensors weights")
