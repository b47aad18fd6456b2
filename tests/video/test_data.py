"""Video data: CSV + PyAV decoding, precomputed latents, the embedded moving shapes."""

import numpy as np
import pytest
import torch

from opendit_lite.data.video_csv import VideoCSVDataset, resize_center_crop
from opendit_lite.data.video_latents import VideoLatentDataset, save_video_latents
from opendit_lite.data.video_shapes import MovingShapesDataset, caption_states


def _write_video(path, frames: int, height: int = 24, width: int = 32):
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=8)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(frames):
            img = np.full((height, width, 3), i * 20, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def test_csv_dataset_samples_frames_with_interval_and_crops(tmp_path):
    _write_video(tmp_path / "a.mp4", frames=10)
    (tmp_path / "list.csv").write_text("path,text\na.mp4,a grey fade\n")
    clip, caption = VideoCSVDataset(str(tmp_path / "list.csv"), num_frames=3, frame_interval=4, image_size=16,
                                    random_start=False)[0]
    assert clip.shape == (3, 3, 16, 16) and caption == "a grey fade"
    # Frames 0, 4, 8 of a fade that brightens by 20 per frame (lossy codec: compare loosely).
    levels = (clip.mean(dim=(0, 2, 3)) + 1) * 127.5
    assert torch.allclose(levels, torch.tensor([0.0, 80.0, 160.0]), atol=8)
    with pytest.raises(ValueError, match="fewer than"):
        VideoCSVDataset(str(tmp_path / "list.csv"), num_frames=4, frame_interval=4, image_size=16)[0]


def test_csv_needs_path_and_text_columns(tmp_path):
    (tmp_path / "bad.csv").write_text("file,caption\na.mp4,x\n")
    with pytest.raises(ValueError, match="'path' and 'text'"):
        VideoCSVDataset(str(tmp_path / "bad.csv"))


def test_csv_sample_shapes_from_columns_or_probed_once_and_bucket_reads(tmp_path, monkeypatch):
    from PIL import Image

    from opendit_lite.data import video_csv

    _write_video(tmp_path / "a.mp4", frames=10)
    Image.new("RGB", (20, 12), (200, 10, 10)).save(tmp_path / "b.png")
    (tmp_path / "list.csv").write_text("path,text,num_frames,height,width\na.mp4,fade,,,\nb.png,red,1,12,20\n"
                                       "a.mp4,listed,7,24,32\n")
    data = VideoCSVDataset(str(tmp_path / "list.csv"), frame_interval=2)
    # Row 0 probed (10 frames at interval 2 -> 5), row 1 and 2 from their columns.
    assert data.sample_shapes == [(5, 24, 32), (1, 12, 20), (7, 24, 32)]
    assert (tmp_path / "list.csv.shapes.json").exists()
    monkeypatch.setattr(video_csv, "probe_shape", lambda *a: pytest.fail("probed again despite the cache"))
    assert VideoCSVDataset(str(tmp_path / "list.csv"), frame_interval=2).sample_shapes[0] == (5, 24, 32)
    clip, caption = data[(0, 3, 8, 16)]          # a bucket's shape: 3 frames, non-square crop
    assert clip.shape == (3, 3, 8, 16) and caption == "fade"
    image, caption = data[(1, 1, 8, 8)]          # the image as a 1-frame sample
    assert image.shape == (3, 1, 8, 8) and caption == "red" and image[0].mean() > 0.5


def test_resize_center_crop_keeps_the_middle():
    frames = torch.zeros(1, 4, 8, 3, dtype=torch.uint8)
    frames[:, :, 2:6] = 255                                   # bright middle columns
    out = resize_center_crop(frames, 4)
    assert out.shape == (3, 1, 4, 4) and out.min() > 0.9


def test_latents_round_trip(tmp_path):
    save_video_latents(str(tmp_path), 0, torch.ones(4, 3, 2, 2), torch.zeros(8, 32),
                       torch.ones(8, dtype=torch.bool), "a red disc moving up")
    latents, states, mask, caption = VideoLatentDataset(str(tmp_path))[0]
    assert latents.shape == (4, 3, 2, 2) and states.shape == (8, 32) and mask.all()
    assert caption == "a red disc moving up"


def test_moving_shapes_are_deterministic_and_captioned():
    data = MovingShapesDataset(num_samples=4, num_frames=3, image_size=16)
    clip, states, mask, caption = data[1]
    assert clip.shape == (3, 3, 16, 16) and clip.min() >= -1 and clip.max() <= 1
    assert torch.equal(clip, data[1][0]) and caption in MovingShapesDataset.all_captions()
    assert mask.sum() == len(caption.split()) and torch.equal(states, caption_states(caption, 8, 32)[0])
    assert not torch.equal(clip[:, 0], clip[:, 1])            # the shape moves
