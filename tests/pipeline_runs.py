"""Runs from a pipeline folder in tests: captioned images and clips on disk for the CSV route
(``data.type: csv``; random pixels, PNG images and MPEG-4 clips, and the ``path,text`` CSV that lists
them), the video trainer's config of such a run, and scripts/extract_latents.py loaded as a module."""

import importlib.util
import os
from typing import Sequence, Tuple

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_image(path, height: int, width: int, seed: int = 0) -> str:
    from PIL import Image

    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(path)
    return str(path)


def write_clip(path, frames: int, height: int, width: int, seed: int = 0) -> str:
    import av

    rng = np.random.default_rng(seed)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=8)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for _ in range(frames):
            frame = av.VideoFrame.from_ndarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return str(path)


def write_csv(folder, rows: Sequence[Tuple[str, str]], name: str = "data.csv") -> str:
    """``rows`` of (file name in ``folder``, caption) as ``folder/name``."""
    path = os.path.join(str(folder), name)
    with open(path, "w") as f:
        f.write("path,text\n" + "".join(f"{file},{caption}\n" for file, caption in rows))
    return path


def pipeline_config(folder: str, csv: str, call: dict, results: str, *extra: str):
    """The video trainer's config (checked as train_video.py checks it) for a run from the pipeline
    ``folder`` on ``csv`` at the size of ``call`` (a tiny pipeline's ``__call__`` keywords)."""
    from opendit_lite.config import load_config
    from opendit_lite.config.video_schema import VideoTrainConfig
    from opendit_lite.training.video import validate_video_config

    overrides = [f"model.pipeline={folder}", "data.type=csv", f"data.path={csv}", f"data.image_size={call['height']}",
                 "data.frame_interval=1", "precision=fp32", "global_batch_size=1", f"results_dir={results}", *extra]
    if "num_frames" in call:
        overrides.append(f"data.num_frames={call['num_frames']}")
    cfg = load_config(None, overrides, schema=VideoTrainConfig)
    validate_video_config(cfg)
    return cfg


def extract_script():
    """scripts/extract_latents.py as a module (its ``main(argv)`` runs in this process)."""
    path = os.path.join(ROOT, "scripts", "extract_latents.py")
    spec = importlib.util.spec_from_file_location("extract_latents", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
