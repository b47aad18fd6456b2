"""docs/finetune_released_model.md's commands, run as the page writes them, on tiny random pipelines:
each ``bash`` block of its "Flux" and "Wan" sections is read from the page, its folders moved from
``/tmp`` and ``/data`` into the test's own, and every line run from a checkout-like folder (``configs/``,
``scripts/`` and the entry scripts linked, so the run goes to its ``outputs/``): make_tiny_pipeline.py
builds the pipeline folder, ``printf`` writes the CSV of your data (the test puts the image or clip it
names beside it), train.py / train_video.py train the LoRA with configs/flux_lora.yaml or
configs/wan_lora.yaml, and the page's ``python -c`` loads the default export into the family's pipeline
with ``load_lora_weights`` (no missing or unexpected key) and generates; the page's sampling commands
sample the run through its pipeline with sample.py (Flux) and sample_video.py (Wan, sp_size=2). Python
lines run in this process; ``torchrun`` lines (Wan at sp_size=2) run their script on the two gloo ranks
torchrun would start, whose losses equal one process's."""

import os
import shlex
import subprocess
from typing import List
from unittest import mock

import numpy as np
import pytest

from tests.distributed import run_script_on_ranks
from tests.pipeline_runs import ROOT, load_script, write_clip, write_csv, write_image
from tests.video_scripts.test_video_scripts import losses

PAGE = os.path.join(ROOT, "docs", "finetune_released_model.md")
LORA = "pytorch_lora_weights.safetensors"


def page_commands(section: str) -> List[str]:
    """The command lines of the first ``bash`` block under the page's heading ``## <section>``
    (continuation lines joined, comment lines left out)."""
    text = open(PAGE).read()
    block = text.split(f"\n## {section}", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.replace("\\\n", " ").splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def checkout(root) -> str:
    """``root/checkout``: the folder the page's commands run from, with what they name of the repository."""
    folder = os.path.join(str(root), "checkout")
    os.makedirs(folder)
    for name in ("configs", "scripts", "train.py", "train_video.py", "sample.py", "sample_video.py"):
        os.symlink(os.path.join(ROOT, name), os.path.join(folder, name))
    os.makedirs(os.path.join(str(root), "data"))
    return folder


def _torchrun_command(argv: List[str]):
    """(script, its arguments, ranks) of the page's ``torchrun --standalone --nproc_per_node N script ...``
    (torchrun's own behaviour is tested in tests/reliability: its summary, signals, a full disk)."""
    options, i = {}, 1
    while argv[i].startswith("--"):
        if "=" in argv[i]:
            key, value = argv[i][2:].split("=", 1)
            options[key], i = value, i + 1
        elif argv[i] == "--standalone":
            options["standalone"], i = True, i + 1
        else:
            options[argv[i][2:]], i = argv[i + 1], i + 2
    assert set(options) <= {"standalone", "nproc_per_node", "nproc-per-node"}, argv  # none the test would drop
    return argv[i], argv[i + 1:], int(options.get("nproc_per_node") or options["nproc-per-node"])


def run_page_line(line: str, root, folder: str) -> None:
    """One command line of the page, its ``/tmp/`` and ``/data/`` folders moved into ``root``, run in ``folder``."""
    line = line.replace("/tmp/", f"{root}/tmp-").replace("/data/", f"{root}/data/")
    argv = shlex.split(line, comments=True)
    if argv[0] == "torchrun":  # more than one process: the script on the ranks torchrun would start
        script, args, ranks = _torchrun_command(argv)
        codes = run_script_on_ranks(script, args, world_size=ranks, cwd=folder, env={"PYTHONPATH": ROOT})
        assert [code for code, _ in codes] == [0] * ranks, line
        return
    if argv[0] != "python":  # a shell line (printf > file)
        subprocess.run(["bash", "-c", line], cwd=folder, check=True)
        return
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        with mock.patch.dict(os.environ):  # a one-process run sets RANK / WORLD_SIZE
            if argv[1] == "-c":
                exec(argv[2], {"__name__": "__page__"})
            else:
                load_script(argv[1]).main(argv[2:])
    finally:
        os.chdir(cwd)


def _run_page(section: str, root, folder: str, data) -> str:
    """Every line of the section's block; ``data(data_folder)`` writes your files before the CSV names them.
    Returns the run folder."""
    from tests.video_scripts.test_lora_export import LoadLog

    commands = page_commands(section)
    assert len(commands) == 4, commands  # "in four commands"
    data(os.path.join(str(root), "data"))
    for line in commands[:-1]:
        run_page_line(line, root, folder)
    with LoadLog() as log:  # the page's last line: the default export into the pipeline, which generates
        run_page_line(commands[-1], root, folder)
    assert not log.key_warnings(), log.text()
    assert "load_lora_weights('outputs/" in commands[-1]
    return commands[-1].split("load_lora_weights('", 1)[1].split("')", 1)[0].rsplit("/", 1)[0]


def test_the_flux_commands_of_the_page(tmp_path, capsys):
    folder = checkout(tmp_path)
    run = _run_page("Flux, in four commands", tmp_path, folder,
                    lambda data: write_image(os.path.join(data, "cat.png"), 40, 48))  # the image the CSV names
    run_dir = os.path.join(folder, run)
    # the adapters alone, no base copy, in both formats (Flux has an original layout)
    assert sorted(os.listdir(os.path.join(run_dir, "diffusers"))) == ["comfyui_lora.safetensors", LORA]
    assert all(np.isfinite(losses(run_dir))) and losses(run_dir)
    assert os.path.isfile(os.path.join(folder, "cat.png"))
    # the page's sampling command: the run through FluxPipeline, one PNG per prompt and a contact sheet
    run_page_line(page_commands("Sample through the pipeline")[0], tmp_path, folder)
    samples = os.path.join(run_dir, "samples")
    (checkpoint,) = os.listdir(samples)
    assert sorted(os.listdir(os.path.join(samples, checkpoint))) == ["00_a_black_cat.png", "01_a_red_car.png",
                                                                     "contact_sheet.png"]
    assert "through FluxPipeline" in capsys.readouterr().out


def test_the_wan_commands_of_the_page_with_the_one_process_losses(tmp_path):
    folder = checkout(tmp_path)
    run = _run_page("Wan, in four commands", tmp_path, folder,
                    lambda data: write_clip(os.path.join(data, "dog.mp4"), 5, 40, 48))  # the clip the CSV names
    run_dir = os.path.join(folder, run)
    assert sorted(os.listdir(os.path.join(run_dir, "diffusers"))) == ["comfyui_lora.safetensors", LORA]
    assert os.path.isfile(os.path.join(folder, "dog.gif"))
    # the page's sampling command at sp_size=2: the run through WanPipeline, its tokens split over 2 ranks
    run_page_line(page_commands("Sample through the pipeline")[1], tmp_path, folder)
    (checkpoint,) = os.listdir(os.path.join(run_dir, "samples"))
    written = sorted(os.listdir(os.path.join(run_dir, "samples", checkpoint)))
    assert written[0].startswith("00_a_dog_running.") and written[1] == "contact_sheet.png", written
    # the same run in one process (the page: "one process ... gives the same losses")
    train = next(line for line in page_commands("Wan, in four commands") if line.startswith("torchrun"))
    one = train.replace("torchrun --standalone --nproc_per_node 2 ", "python ").replace(" sp_size=2", "")
    run_page_line(one + " results_dir=one", tmp_path, folder)
    serial, parallel = losses(os.path.join(folder, "one", "wan_lora")), losses(run_dir)
    assert serial and np.allclose(serial, parallel, rtol=1e-4, atol=1e-6), (serial, parallel)


@pytest.mark.parametrize("config", ["configs/flux_lora.yaml", "configs/wan_lora.yaml"])
def test_the_configs_point_at_a_pipeline_folder_to_edit(config, capsys, tmp_path):
    from tests.video_scripts.test_family_scripts import exits_2

    csv = write_csv(tmp_path, [("a.png", "a caption")])
    err = exits_2(capsys, "train_video", ["--config", config, f"data.path={csv}"])
    assert "'model.pipeline' '/path/to/" in err and "is not a folder" in err


def test_the_wan_image_to_video_commands_of_the_page(tmp_path, capsys):
    """The page's image-to-video block: the tiny WanImageToVideoPipeline, a clip whose first frame is its
    image, a LoRA run, and sample_video.py with the image the prompt starts from."""
    folder = checkout(tmp_path)
    commands = page_commands("Wan image-to-video, in four commands")
    assert len(commands) == 4, commands
    data = os.path.join(str(tmp_path), "data")
    write_clip(os.path.join(data, "dog.mp4"), 5, 40, 48)
    write_image(os.path.join(data, "dog.png"), 32, 32)
    for line in commands:
        run_page_line(line, tmp_path, folder)
    run_dir = os.path.join(folder, "outputs", "wan_i2v_lora")
    assert all(np.isfinite(losses(run_dir))) and losses(run_dir)
    assert sorted(os.listdir(os.path.join(run_dir, "diffusers"))) == ["comfyui_lora.safetensors", LORA]
    (checkpoint,) = os.listdir(os.path.join(run_dir, "samples"))
    written = sorted(os.listdir(os.path.join(run_dir, "samples", checkpoint)))
    assert written[0].startswith("00_a_dog_running.") and written[1] == "contact_sheet.png", written
    assert "through WanImageToVideoPipeline" in capsys.readouterr().out


def test_the_qwen_image_edit_commands_of_the_page(tmp_path, capsys, monkeypatch):
    """The page's edit block: the tiny QwenImageEditPipeline, an edit CSV (result, instruction, reference), a LoRA
    run with configs/qwen_image_edit_lora.yaml, sample.py with the reference each prompt edits, and the LoRA loaded
    into the pipeline without a key warning. The pipeline resizes references to about 1024 x 1024 pixels (65,536
    tokens on the tiny folder's VAE): diffusers' area rule is shrunk to 48 x 48 for the run, the sampling and the
    page's ``python -c`` alike (all in this process), as the page says."""
    import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit as edit

    from tests.video_scripts.test_lora_export import LoadLog

    original = edit.calculate_dimensions
    monkeypatch.setattr(edit, "calculate_dimensions", lambda area, ratio: original(48 * 48, ratio))
    folder = checkout(tmp_path)
    commands = page_commands("Qwen-Image-Edit, in five commands")
    assert len(commands) == 5, commands
    data = os.path.join(str(tmp_path), "data")
    write_image(os.path.join(data, "blue_car.png"), 40, 48)
    write_image(os.path.join(data, "car.png"), 40, 56, seed=1)
    for line in commands[:-1]:
        run_page_line(line, tmp_path, folder)
    with LoadLog() as log:
        run_page_line(commands[-1], tmp_path, folder)
    assert not log.key_warnings(), log.text()
    run_dir = os.path.join(folder, "outputs", "qwen_image_edit_lora")
    assert all(np.isfinite(losses(run_dir))) and len(losses(run_dir)) > 0
    assert sorted(os.listdir(os.path.join(run_dir, "diffusers"))) == ["comfyui_lora.safetensors", LORA]
    (checkpoint,) = os.listdir(os.path.join(run_dir, "samples"))
    written = sorted(os.listdir(os.path.join(run_dir, "samples", checkpoint)))
    assert written == ["00_make_the_car_blue.png", "contact_sheet.png"], written
    assert os.path.isfile(os.path.join(folder, "blue_car.png"))
    assert "through QwenImageEditPipeline" in capsys.readouterr().out
