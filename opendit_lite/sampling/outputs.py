"""The files a sampling run writes: a labelled PNG grid of images (sample.py), and per prompt an MP4
(an animated GIF where MP4 encoding is unavailable), or a PNG for an image pipeline's samples, with a
PNG contact sheet of every clip's frames (sample_video.py)."""

import os
import re
import sys
from typing import List, Sequence

import torch
from PIL import Image, ImageDraw


def default_output(run_dir: str, ckpt: str, suffix: str = "") -> str:
    """Where a sampling run writes when no output is set: ``<run dir>/samples/<checkpoint name><suffix>``
    (``demo_step1500.png`` for ``.../checkpoints/demo_step1500``, ``DiT-XL-2-256x256.png`` for an
    original ``.pt``), so sampling another checkpoint never replaces the samples of this one."""
    name = os.path.basename(os.path.normpath(ckpt))
    stem = os.path.splitext(name)[0] if os.path.isfile(ckpt) else name
    return os.path.join(run_dir, "samples", stem + suffix)


def labelled_grid(images: torch.Tensor, rows: int, names) -> Image.Image:
    """images [rows*cols, 3, H, W] in [-1, 1] -> one PIL grid with each row's class name on the left."""
    cols = images.shape[0] // rows
    h, w = images.shape[-2:]
    scale = max(1, 64 // h)  # small images are upscaled so the grid is readable
    pad, margin = 2, 110
    arr = ((images.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    grid = Image.new("RGB", (margin + cols * (w * scale + pad), rows * (h * scale + pad)), "white")
    draw = ImageDraw.Draw(grid)
    for i, img in enumerate(arr):
        r, c = divmod(i, cols)
        tile = Image.fromarray(img).resize((w * scale, h * scale), Image.NEAREST)
        grid.paste(tile, (margin + c * (w * scale + pad), r * (h * scale + pad)))
    for r, name in enumerate(names):
        draw.text((4, r * (h * scale + pad) + h * scale // 2 - 5), str(name)[:18], fill="black")
    return grid


def to_frames(clip: torch.Tensor, min_side: int = 128) -> List[Image.Image]:
    """clip [3, T, H, W] in [-1, 1] -> T RGB images, small clips upscaled (nearest) to be watchable;
    sides are kept even, which H.264's 4:2:0 chroma needs."""
    arr = ((clip.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 3, 0).cpu().numpy()
    h, w = arr.shape[1:3]
    scale = max(1, -(-min_side // min(h, w)))
    size = (w * scale + (w * scale) % 2, h * scale + (h * scale) % 2)
    return [Image.fromarray(a).resize(size, Image.NEAREST) for a in arr]


def write_video(frames: List[Image.Image], stem: str, fps: int) -> str:
    """``stem.mp4`` via PyAV (H.264, else MPEG-4 part 2); ``stem.gif`` if encoding fails."""
    path = stem + ".mp4"
    try:
        import av

        codec = "libx264" if "libx264" in av.codecs_available else "mpeg4"
        with av.open(path, "w") as container:
            stream = container.add_stream(codec, rate=fps)
            stream.width, stream.height = frames[0].size
            stream.pix_fmt = "yuv420p"
            for frame in frames:
                container.mux(stream.encode(av.VideoFrame.from_image(frame)))
            container.mux(stream.encode())  # flush the encoder
        return path
    except Exception as err:  # no PyAV, no encoder in its FFmpeg build, ...
        if os.path.exists(path):
            os.remove(path)
        print(f"MP4 encoding failed ({type(err).__name__}: {err}); writing a GIF instead", file=sys.stderr)
    path = stem + ".gif"
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=max(1, round(1000 / fps)), loop=0)
    return path


def contact_sheet(rows: List[List[Image.Image]], prompts: List[str], max_tile: int = 96) -> Image.Image:
    """One row of frames per prompt, the prompt written above its row."""
    w, h = rows[0][0].size
    scale = min(1.0, max_tile / max(w, h))
    tw, th = max(1, round(w * scale)), max(1, round(h * scale))
    pad, text_h = 2, 14
    cols = max(len(r) for r in rows)
    sheet = Image.new("RGB", (cols * (tw + pad) + pad, len(rows) * (th + text_h + pad) + pad), "white")
    draw = ImageDraw.Draw(sheet)
    for r, (frames, prompt) in enumerate(zip(rows, prompts)):
        top = pad + r * (th + text_h + pad)
        draw.text((pad, top), prompt[: (sheet.width - 2 * pad) // 6], fill="black")
        for c, frame in enumerate(frames):
            sheet.paste(frame.resize((tw, th), Image.NEAREST), (pad + c * (tw + pad), top + text_h))
    return sheet


def slug(prompt: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", prompt.lower()).strip("_")[:40] or "prompt"


def write_videos(clips: torch.Tensor, prompts: Sequence[str], out_dir: str, fps: int) -> List[str]:
    """clips [n, 3, T, H, W] in [-1, 1], one per prompt -> ``NN_<prompt>.mp4`` (or ``.gif``) each and
    ``contact_sheet.png`` in ``out_dir``; returns their paths, the contact sheet last."""
    os.makedirs(out_dir, exist_ok=True)
    rows = [to_frames(clip) for clip in clips]
    paths = [write_video(frames, os.path.join(out_dir, f"{i:02d}_{slug(p)}"), fps)
             for i, (frames, p) in enumerate(zip(rows, prompts))]
    sheet = os.path.join(out_dir, "contact_sheet.png")
    contact_sheet(rows, list(prompts)).save(sheet)
    return paths + [sheet]


def write_images(images: torch.Tensor, prompts: Sequence[str], out_dir: str) -> List[str]:
    """images [n, 3, H, W] in [-1, 1], one per prompt -> ``NN_<prompt>.png`` each, at their own size, and
    ``contact_sheet.png`` in ``out_dir``; returns their paths, the contact sheet last."""
    os.makedirs(out_dir, exist_ok=True)
    arr = ((images.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    pictures = [Image.fromarray(a) for a in arr]
    paths = [os.path.join(out_dir, f"{i:02d}_{slug(p)}.png") for i, p in enumerate(prompts)]
    for picture, path in zip(pictures, paths):
        picture.save(path)
    sheet = os.path.join(out_dir, "contact_sheet.png")
    contact_sheet([[p] for p in pictures], list(prompts)).save(sheet)
    return paths + [sheet]
