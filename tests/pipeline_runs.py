"""Runs from a pipeline folder in tests: captioned images and clips on disk for the CSV route
(``data.type: csv``; random pixels, PNG images and MPEG-4 clips, and the ``path,text`` CSV that lists
them), the video trainer's config of such a run, scripts/extract_latents.py loaded as a module, and the
latents it extracts from such data (``extracted_latents``)."""

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


def load_script(path: str):
    """The repository's script ``path`` (relative to its root, e.g. ``scripts/extract_latents.py``) as a
    module: its ``main(argv)`` runs in this process."""
    name = "script_" + path.replace("/", "_").replace(".", "_")
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def extract_script():
    """scripts/extract_latents.py as a module (its ``main(argv)`` runs in this process)."""
    return load_script("scripts/extract_latents.py")


def extracted_latents(folder: str, root, captions: Sequence[str], frames: int = 1, size: int = 16) -> str:
    """``root/latents``: the latents route's data of the pipeline ``folder``, made as a user makes it: one
    random image (``frames`` 1) or clip of ``size`` pixels per caption, listed in a CSV and extracted by
    scripts/extract_latents.py --pipeline (the pipeline's fingerprint and the clips' sizes recorded)."""
    media = os.path.join(str(root), "media")
    os.makedirs(media, exist_ok=True)
    rows = []
    for i, caption in enumerate(captions):
        path = os.path.join(media, f"{i}.png" if frames == 1 else f"{i}.mp4")
        rows.append((write_image(path, size, size, seed=i) if frames == 1 else
                     write_clip(path, frames, size, size, seed=i), caption))
    out = os.path.join(str(root), "latents")
    count = extract_script().main(["--pipeline", folder, "--csv", write_csv(media, rows), "--num-frames", str(frames),
                                   "--height", str(size), "--width", str(size), "--frame-interval", "1",
                                   "--num-workers", "0", "--output", out])
    assert count == len(captions)
    return out
