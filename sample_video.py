#!/usr/bin/env python
"""Sample videos from text prompts with classifier-free guidance (against the model's learned null
caption); writes one MP4 per prompt (an animated GIF where MP4 encoding is unavailable) and a PNG
contact sheet with one row of frames per prompt, and prints their paths. The same seed gives the
same videos.

From the newest checkpoint of a run (EMA weights by default), prompts from the config:
    python sample_video.py --config configs/video_stdit_demo.yaml
At another clip shape than the trained one (frames and pixels; the models take any shape):
    python sample_video.py --config configs/video_buckets_demo.yaml sample.num_frames=1 sample.height=16 sample.width=24
On several processes (prompts split over the data-parallel ranks; sp_size=2 shards each clip's
tokens over 2 ranks with Ulysses, sp_mode=ring/usp, or DSP with sp_mode=dsp); the videos are the one-process videos:
    torchrun --standalone --nproc_per_node 4 sample_video.py --config configs/video_stdit_demo.yaml sp_size=2
Prompts on the command line or from a file (one a line):
    python sample_video.py --config configs/video_stdit_demo.yaml 'sample.prompts=["a red disc moving up"]'
    python sample_video.py --config configs/video_stdit_xl.yaml sample.prompt_file=prompts.txt \\
        text_encoder.path=/models/t5-v1_1-xxl vae.path=/models/sd-vae-ft-ema

The model, text-encoder kind and objective are those saved with the checkpoint; ``sample.*`` (and
local paths such as ``vae.path``/``text_encoder.path``) come from this command.
"""

import os
import re
import sys
from typing import List, Sequence

import torch
from PIL import Image, ImageDraw

from opendit_lite.utils.quiet import quiet_third_party_startup

quiet_third_party_startup()  # before colossalai is imported

from opendit_lite.build.denoiser import parallelize_denoiser
from opendit_lite.build.lora import load_merged
from opendit_lite.build.video import build_video_model, load_caption_encoder, load_video_vae, sample_clip_shape
from opendit_lite.checkpoint.layout import resolve_sample_checkpoint, saved_config
from opendit_lite.config import ConfigError, from_dict, parse_cli
from opendit_lite.config.video_schema import TextEncoderConfig, VideoDiffusionConfig, VideoModelConfig, VideoTrainConfig
from opendit_lite.diffusion import RectifiedFlow, cfg_model_fn, create_diffusion
from opendit_lite.diffusion.sampling_utils import SampleGenerators
from opendit_lite.sampling import gather_on_main, sampling_ranks
from opendit_lite.sampling.checks import check_sample_settings
from opendit_lite.training.video import validate_video_config
from opendit_lite.utils.exit_codes import script_main

# Captions of the embedded moving-shapes data, used when no prompts are given for it.
SHAPES_PROMPTS = ["a red square moving right", "a blue disc moving down", "a green disc moving left",
                  "a yellow square moving up"]


def adopt_checkpoint_config(cfg, ckpt: str) -> None:
    """Take the model, diffusion and text-encoder kind the checkpoint was trained with, in place;
    a local text_encoder.path given here wins over the saved one."""
    saved = saved_config(ckpt)
    if "model" not in saved:
        raise ConfigError(f"{ckpt!r} carries no saved config (meta.json): sample_video.py reads checkpoints "
                          f"written by train_video.py.")
    cfg.model = from_dict(VideoModelConfig, saved["model"], "model.")
    cfg.diffusion = from_dict(VideoDiffusionConfig, saved["diffusion"], "diffusion.")
    path = cfg.text_encoder.path
    cfg.text_encoder = from_dict(TextEncoderConfig, saved["text_encoder"], "text_encoder.")
    cfg.text_encoder.path = path or cfg.text_encoder.path


def read_prompts(cfg) -> List[str]:
    s = cfg.sample
    if s.prompts:
        return list(s.prompts)
    if s.prompt_file:
        if not os.path.isfile(s.prompt_file):
            raise ConfigError(f"'sample.prompt_file' {s.prompt_file!r} does not exist.")
        with open(s.prompt_file) as f:
            prompts = [line.strip() for line in f if line.strip()]
        if not prompts:
            raise ConfigError(f"'sample.prompt_file' {s.prompt_file!r} holds no prompts (one per line).")
        return prompts
    if cfg.text_encoder.kind == "shapes":
        return list(SHAPES_PROMPTS)
    raise ConfigError("No prompts: set sample.prompts=[...] or sample.prompt_file=<text file, one prompt a line>.")


def check_sampler(cfg) -> None:
    trained, sampler = cfg.diffusion.objective, cfg.sample.sampler
    if (trained == "rflow") != (sampler == "euler"):
        fits = "euler" if trained == "rflow" else "ddpm or ddim"
        raise ConfigError(f"The model was trained with diffusion.objective={trained}; sample.sampler={sampler} does "
                          f"not fit it: use sample.sampler={fits}.")


@torch.no_grad()
def sample_clips(model, cfg, states: torch.Tensor, mask: torch.Tensor, indices: Sequence[int], device,
                 pixel_space: bool, progress: bool = False, downsample: int = 1) -> torch.Tensor:
    """Caption states [n, M, Cy] of global prompts ``indices`` -> clips [n, C, T, H, W] in model space
    (latents or pixels), of the trained clip shape or the one ``sample.num_frames/height/width`` ask
    for. Each clip's noise comes from (sample.seed, its index), so the result does not depend on
    which prompts share the batch, rank or world size."""
    s = cfg.sample
    generators = SampleGenerators(s.seed, indices)
    shape = sample_clip_shape(cfg, downsample, model.patch_size)
    z = generators.standard_normal((states.shape[0], *shape), device, torch.float32)  # [n, C, T, H, W]
    # Guidance by the model's layout (video models: [captions; learned null caption] as one batch of 2n).
    guided = cfg_model_fn(model, s.cfg_scale)
    kwargs = dict(y=states, mask=mask)
    if s.sampler == "euler":
        rf = RectifiedFlow(num_timesteps=cfg.diffusion.diffusion_steps)
        return rf.sample(guided, noise=z, model_kwargs=kwargs, num_steps=s.num_sampling_steps, progress=progress,
                         generator=generators)
    prefix = "ddim" if s.sampler == "ddim" else ""
    diffusion = create_diffusion(f"{prefix}{s.num_sampling_steps}", noise_schedule=cfg.diffusion.noise_schedule,
                                 learn_sigma=cfg.model.learn_sigma, diffusion_steps=cfg.diffusion.diffusion_steps)
    loop = diffusion.ddim_sample_loop if s.sampler == "ddim" else diffusion.p_sample_loop
    return loop(guided, z.shape, z, clip_denoised=pixel_space, model_kwargs=kwargs, progress=progress,
                device=device, generator=generators)


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


@script_main
def main(argv) -> List[str]:
    cfg = parse_cli(argv, __doc__, schema=VideoTrainConfig)
    validate_video_config(cfg)
    ckpt = resolve_sample_checkpoint(cfg, cfg.sample.ckpt, "train_video.py", family="video")
    adopt_checkpoint_config(cfg, ckpt)
    check_sampler(cfg)
    prompts = read_prompts(cfg)
    pixel_space = cfg.model.in_channels == 3 and not cfg.vae.path
    if not pixel_space and not cfg.vae.path:
        raise ConfigError(f"The model works on {cfg.model.in_channels}-channel latents: set vae.path to the local "
                          f"VAE folder that decodes them.")
    check_sample_settings(cfg.sample.seed, cfg.sample.batch_size)
    with sampling_ranks(cfg.sp_size) as ranks:
        device = ranks.device
        model = build_video_model(cfg)
        load_merged(model, ckpt, use_ema=cfg.sample.use_ema, lora=saved_config(ckpt).get("lora"))  # LoRA: merged
        report = parallelize_denoiser(model, cfg, ranks.sp_group)  # the training machinery: SP (any mode), compile
        if ranks.is_main and (ranks.sp_size > 1 or cfg.sample.compile):
            print(report)
        model.to(device).eval()
        captions, vae = load_caption_encoder(cfg, device), load_video_vae(cfg, device)
        block, mine = ranks.shard(len(prompts)), []
        for start in range(block.start, block.stop, cfg.sample.batch_size):  # this rank's prompts
            indices = range(start, min(start + cfg.sample.batch_size, block.stop))
            states, mask = captions.encode([prompts[i] for i in indices], device)      # [n, M, Cy], [n, M]
            clips = sample_clips(model, cfg, states, mask, indices, device, pixel_space, progress=ranks.is_main,
                                 downsample=vae.downsample if vae is not None else 1)  # [n, C, T, H, W]
            if vae is not None:
                clips = vae.decode(clips)                                            # [n, 3, T, H', W']
            mine.append(clips.float().cpu())
        clips = gather_on_main(torch.cat(mine) if mine else torch.empty(0), ranks)
        if not ranks.is_main:
            return []

    out_dir = cfg.sample.output_dir or os.path.join(cfg.results_dir, cfg.exp_name, "samples")
    os.makedirs(out_dir, exist_ok=True)
    rows = [to_frames(clip) for clip in clips]
    paths = [write_video(frames, os.path.join(out_dir, f"{i:02d}_{slug(p)}"), cfg.sample.fps)
             for i, (frames, p) in enumerate(zip(rows, prompts))]
    sheet = os.path.join(out_dir, "contact_sheet.png")
    contact_sheet(rows, prompts).save(sheet)
    print(f"sampled {len(prompts)} prompts from {ckpt} (seed {cfg.sample.seed}, cfg_scale {cfg.sample.cfg_scale}):")
    for path in paths + [sheet]:
        print(path)
    return paths + [sheet]


if __name__ == "__main__":
    main()
