"""Folder datasets (``data.type: folder``): media files with same-stem caption files, several folders
mixed by repeats, control folders matched by stem giving the conditioning images; the same rows,
items and training inputs as the equivalent CSV, and the errors of bad folders."""

import os

import pytest
import torch

from opendit_lite.data.media_folders import folder_entries, read_media_folders
from opendit_lite.data.video_csv import ConditioningImages, media_dataset
from opendit_lite.errors import ConfigError
from tests.pipeline_runs import write_image


def _captioned(folder, names, captions):
    os.makedirs(folder, exist_ok=True)
    for i, name in enumerate(names):
        write_image(os.path.join(folder, name), 16, 24, seed=i)
        if captions[i] is not None:
            with open(os.path.join(folder, os.path.splitext(name)[0] + ".txt"), "w") as f:
                f.write(captions[i] + "\n")
    return str(folder)


def test_media_with_caption_files_become_rows_and_a_missing_caption_is_named(tmp_path, capsys):
    folder = _captioned(tmp_path / "set", ["b.png", "a.png", "c.jpg"], ["a  blue\nsquare", "a red disc", None])
    (tmp_path / "set" / "notes.md").write_text("not media")
    rows = read_media_folders(folder)
    assert [(os.path.basename(r.path), r.caption, r.images) for r in rows] == [
        ("a.png", "a red disc", ()), ("b.png", "a blue square", ()), ("c.jpg", "", ())]
    assert "1 media file(s) have no caption file" in capsys.readouterr().err and "c.jpg" in rows[2].where
    with pytest.raises(ValueError, match=r"1 media file\(s\) have no caption file .*c\.jpg"):
        read_media_folders(folder, require_captions=True)


def test_entries_mix_by_repeats_and_controls_match_by_stem(tmp_path):
    one = _captioned(tmp_path / "one", ["x.png"], ["x caption"])
    two = _captioned(tmp_path / "two", ["y.png", "z.png"], ["y caption", "z caption"])
    before = _captioned(tmp_path / "before", ["y.png"], [None])
    rows = read_media_folders([{"path": one, "repeats": 3}, {"path": two, "control_path": before}])
    assert [os.path.basename(r.path) for r in rows] == ["x.png"] * 3 + ["y.png", "z.png"]
    assert rows[3].images == (os.path.join(before, "y.png"),) and rows[4].images == ()
    write_image(tmp_path / "before" / "w.png", 8, 8)
    with pytest.raises(ValueError, match=r"control folder .*before has 1 file\(s\) whose stem matches no media file"):
        read_media_folders([{"path": two, "control_path": before}])
    for bad, message in (([{"path": one, "repeats": 0}], "repeats must be a positive integer"),
                         ([{"path": one, "captions": ".txt"}], "unknown key"),
                         ([{"path": str(tmp_path / "nope")}], "is not a folder"),
                         ([], "needs data.path")):
        with pytest.raises(ValueError, match=message):
            folder_entries(bad)


def test_a_folder_dataset_gives_the_items_of_the_equivalent_csv(tmp_path):
    folder = _captioned(tmp_path / "set", ["a.png", "b.png"], ["a red disc", "a blue square"])
    controls = _captioned(tmp_path / "controls", ["a.png", "b.png"], [None, None])
    csv = tmp_path / "data.csv"
    csv.write_text("path,text,image\nset/a.png,a red disc,controls/a.png\nset/b.png,a blue square,controls/b.png\n")
    images = ConditioningImages("reference", 1, lambda h, w: (h, w))
    from_folder = media_dataset("folder", [{"path": folder, "control_path": controls}], 1, 1, 16, images=images)
    from_csv = media_dataset("csv", str(csv), 1, 1, 16, images=images)
    assert from_folder.sample_shapes == from_csv.sample_shapes == [(1, 16, 24)] * 2
    for i in range(2):
        a, b = from_folder[(i, 1, 16, 16)], from_csv[(i, 1, 16, 16)]
        assert torch.equal(a[0], b[0]) and a[1] == b[1] and all(torch.equal(x, y) for x, y in zip(a[2], b[2]))


def test_the_config_takes_a_folder_or_a_list_of_entries_and_refuses_a_list_elsewhere(tmp_path):
    from opendit_lite.config import load_config
    from opendit_lite.config.video_schema import VideoTrainConfig

    folder = _captioned(tmp_path / "set", ["a.png"], ["a red disc"])
    cfg = load_config(None, ["data.type=folder", f"data.path=[{{path: {folder}, repeats: 2}}]"],
                      schema=VideoTrainConfig)
    assert cfg.data.path == [{"path": folder, "repeats": 2}]
    assert load_config(None, ["data.type=folder", f"data.path={folder}"], schema=VideoTrainConfig).data.path == folder
    with pytest.raises(ConfigError, match="only data.type=folder reads"):
        load_config(None, ["data.type=csv", f"data.path=[{{path: {folder}}}]"], schema=VideoTrainConfig)


def test_a_pipeline_run_on_a_folder_trains_the_inputs_of_the_same_csv(tmp_path, tiny_pipeline):
    from opendit_lite.families.tiny_pipelines import TINY_CALLS
    from opendit_lite.training.video import prepare_video_data
    from tests.pipeline_runs import pipeline_config

    call = TINY_CALLS["flux"]
    folder = _captioned(tmp_path / "set", ["a.png"], ["a red disc"])
    csv = tmp_path / "data.csv"
    csv.write_text("path,text\nset/a.png,a red disc\n")
    pipe = tiny_pipeline("flux")
    inputs = []
    for kind, path in (("folder", folder), ("csv", str(csv))):
        cfg = pipeline_config(pipe, path, call, str(tmp_path / kind), f"data.type={kind}")
        data = prepare_video_data(cfg, torch.device("cpu"))
        clip, caption = data.dataset[0]
        inputs.append(data.model_inputs((clip[None], [caption])))
    (x_folder, text_folder), (x_csv, text_csv) = inputs
    assert torch.equal(x_folder, x_csv) and text_folder.keys() == text_csv.keys()
    assert all(torch.equal(text_folder[k], text_csv[k]) for k in text_csv)


def test_latents_extract_from_a_folder_config(tmp_path, tiny_pipeline):
    from opendit_lite.data.video_latents import video_latent_meta
    from tests.pipeline_runs import load_script

    folder = _captioned(tmp_path / "set", ["a.png", "b.png"], ["a red disc", "a blue square"])
    config = tmp_path / "run.yaml"
    config.write_text(f"model:\n  pipeline: {tiny_pipeline('flux')}\ndata:\n  type: folder\n  path: {folder}\n"
                      f"  image_size: 16\n")
    load_script("scripts/extract_latents.py").main(["--config", str(config), "--output", str(tmp_path / "latents"),
                                                    "--num-workers", "0"])
    meta = video_latent_meta(str(tmp_path / "latents"))
    assert meta["count"] == 2 and meta["storage"] == "mds" and meta["pixel_sizes"] == [[1, 16, 16]]
