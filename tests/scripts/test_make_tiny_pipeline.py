"""scripts/make_tiny_pipeline.py: writes a family's tiny pipeline that DiffusionPipeline loads; an
unknown family, an output that is a file or a non-empty folder (without --overwrite) end with exit 2
and one paragraph."""

import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _main(*argv):
    path = os.path.join(ROOT, "scripts", "make_tiny_pipeline.py")
    spec = importlib.util.spec_from_file_location("make_tiny_pipeline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(list(argv))


def _refused(capsys, *argv) -> str:
    capsys.readouterr()  # what earlier calls printed
    with pytest.raises(SystemExit) as exit_info:
        _main(*argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_writes_a_pipeline_diffusers_loads_and_refuses_to_overwrite_unasked(tmp_path, capsys):
    from diffusers import DiffusionPipeline

    out = tmp_path / "ltx"
    assert _main("--family", "ltx", "--out", str(out)) == 0
    with open(out / "model_index.json") as f:
        assert json.load(f)["_class_name"] == "LTXPipeline"
    assert type(DiffusionPipeline.from_pretrained(str(out), local_files_only=True)).__name__ == "LTXPipeline"

    assert "--overwrite" in _refused(capsys, "--family", "ltx", "--out", str(out))
    (out / "extra.txt").write_text("left by hand")
    assert _main("--family", "ltx", "--out", str(out), "--overwrite", "--seed", "1") == 0
    assert not (out / "extra.txt").exists() and (out / "transformer" / "config.json").is_file()


def test_bad_family_or_output_is_one_paragraph(tmp_path, capsys):
    err = _refused(capsys, "--family", "sdxl", "--out", str(tmp_path / "x"))
    assert "'sdxl'" in err and "flux" in err and "wan22" in err
    assert not (tmp_path / "x").exists()
    file = tmp_path / "file"
    file.write_text("")
    assert "is a file, not a folder" in _refused(capsys, "--family", "flux", "--out", str(file))
