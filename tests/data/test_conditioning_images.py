"""The CSV route's conditioning images (image-to-video and edit pipelines): the ``image`` column read
per row, the clip's own first frame or a named file resized and cropped as the clip, references
resized exactly to the size their pipeline takes, batches that keep each sample's images, the rows a
pipeline cannot take refused by line, the masked loss, and the refusals of ``sample.images`` and of
``data.num_frames=0``."""

import os

import pytest
import torch

from opendit_lite.data.video_csv import (
    ConditioningImages,
    VideoCSVDataset,
    collate_conditioned,
    read_conditioned_csv,
    resize_center_crop,
)
from opendit_lite.diffusion.likelihood import mean_flat
from opendit_lite.errors import ConfigError
from tests.pipeline_runs import write_clip, write_image


def _csv(folder, rows, header="path,text,image"):
    path = os.path.join(str(folder), "data.csv")
    with open(path, "w") as f:
        f.write(header + "\n" + "".join(",".join(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    folder = tmp_path_factory.mktemp("media")
    write_clip(folder / "clip.mp4", 5, 24, 32)
    write_image(folder / "a.png", 20, 30, seed=1)
    write_image(folder / "b.png", 30, 20, seed=2)
    (folder / "broken.png").write_bytes(b"not an image")
    return folder


def test_the_image_column_is_read_per_row_resolved_from_the_csv_folder(media):
    rows = read_conditioned_csv(_csv(media, [("clip.mp4", "one", "a.png|b.png"), ("clip.mp4", "two", "")]))
    assert [r[2] for r in rows] == [(str(media / "a.png"), str(media / "b.png")), ()]
    assert [r.where for r in rows] == ["line 2", "line 3"]  # the CSV lines, for errors naming the rows


def test_first_frame_is_the_clip_as_loaded_or_the_named_file_cropped_as_the_clip(media):
    csv = _csv(media, [("clip.mp4", "own frame", ""), ("clip.mp4", "named", "b.png")])
    dataset = VideoCSVDataset(csv, num_frames=5, frame_interval=1, image_size=16, random_start=False,
                              images=ConditioningImages("first_frame"))
    clip, caption, images = dataset[0]
    assert caption == "own frame" and len(images) == 1 and torch.equal(images[0], clip[:, 0])
    clip, _, images = dataset[(1, 5, 16, 24)]                                      # a bucket's size
    assert clip.shape == (3, 5, 16, 24) and images[0].shape == (3, 16, 24)
    from opendit_lite.data.video_csv import load_image

    assert torch.equal(images[0], resize_center_crop(load_image(str(media / "b.png")), 16, 24)[:, 0])


def test_references_are_resized_to_the_size_their_pipeline_takes_and_batched_per_sample(media):
    csv = _csv(media, [("clip.mp4", "edit a", "a.png"), ("clip.mp4", "edit b", "b.png|a.png")])
    dataset = VideoCSVDataset(csv, num_frames=1, frame_interval=1, image_size=16, random_start=False,
                              images=ConditioningImages("reference", 2, lambda h, w: (h // 10 * 8, w // 10 * 8)))
    items = [(i, dataset[i]) for i in range(2)]
    assert [tuple(im.shape) for im in items[0][1][2]] == [(3, 16, 24)]
    assert [tuple(im.shape) for im in items[1][1][2]] == [(3, 24, 16), (3, 16, 24)]
    assert all(im.min() >= -1 and im.max() <= 1 for _, item in items for im in item[2])
    indices, (clips, captions, images) = collate_conditioned(items)
    assert indices.tolist() == [0, 1] and clips.shape == (2, 3, 1, 16, 16) and captions == ["edit a", "edit b"]
    assert [len(i) for i in images] == [1, 2]


def test_rows_a_pipeline_cannot_take_are_refused_naming_the_lines(media, tiny_pipeline):
    from opendit_lite.builders.pipeline import check_conditioning_rows, pipeline_folder

    folder = pipeline_folder(tiny_pipeline("flux"))
    paths = [(str(media / "a.png"),), ()]
    text_only = r"1 row\(s\) name a conditioning image .*\(rows: line 2\), but FluxPipeline is a text-only"
    with pytest.raises(ConfigError, match=text_only):
        check_conditioning_rows(folder, "data.csv", paths, ["line 2", "line 3"])

    class Edit(type(folder.conditioning)):
        image_input, max_images = "reference", 1

    class EditFolder(type(folder)):
        conditioning = Edit()

    edit = EditFolder(**{f: getattr(folder, f) for f in ("path", "index", "family", "experts")})
    with pytest.raises(ConfigError, match=r"1 row\(s\) have no reference image \(rows: line 3\)"):
        check_conditioning_rows(edit, "data.csv", paths, ["line 2", "line 3"])
    with pytest.raises(ConfigError, match=r"more conditioning images than the 1 .*\(rows: line 4\)"):
        check_conditioning_rows(edit, "data.csv", [(str(media / "a.png"),) * 2], ["line 4"])
    with pytest.raises(ConfigError, match=r"data.csv, line 5: the conditioning image .*missing.png' does not exist"):
        check_conditioning_rows(edit, "data.csv", [(str(media / "missing.png"),)], ["line 5"])
    with pytest.raises(ConfigError, match=r"data.csv, line 6: the conditioning image .*broken.png' cannot be decoded"):
        check_conditioning_rows(edit, "data.csv", [(str(media / "broken.png"),)], ["line 6"])


def test_the_masked_loss_is_the_mean_over_the_kept_elements():
    x = torch.arange(24.0).view(2, 3, 4)
    mask = torch.tensor([1.0, 0.0, 1.0, 1.0]).view(1, 1, 4)
    reference = torch.stack([x[b][:, [0, 2, 3]].mean() for b in range(2)])
    assert torch.allclose(mean_flat(x, mask), reference)
    assert torch.equal(mean_flat(x), x.mean(dim=(1, 2)))
    assert torch.equal(mean_flat(x, torch.zeros(1, 1, 4)), torch.zeros(2))  # nothing kept: no loss


def test_a_video_config_with_zero_frames_is_refused():
    from opendit_lite.config import load_config
    from opendit_lite.config.video_schema import VideoTrainConfig

    with pytest.raises(ConfigError, match="'data.num_frames' must be a positive integer; got 0"):
        load_config("configs/video_stdit_demo.yaml", ["data.num_frames=0"], schema=VideoTrainConfig)
