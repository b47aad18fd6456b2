#!/usr/bin/env python
"""Sample class-conditional images with classifier-free guidance and write a labelled PNG grid
(one row per class label). The same seed gives the same images.

From the newest checkpoint of a run (EMA weights by default):
    python sample.py --config configs/demo.yaml
From an original DiT checkpoint (weights and VAE from local paths; nothing is downloaded):
    python sample.py --config configs/dit_xl2_256.yaml sample.ckpt=/models/DiT-XL-2-256x256.pt \\
        vae.path=/models/sd-vae-ft-ema sample.class_labels=[207,360,387,974,88,979,417,279]

``python sample.py --help`` lists every key; the ``sample.*`` section is specific to this script.
"""

import os
import sys

import torch
from PIL import Image, ImageDraw

from opendit_lite.utils.quiet import quiet_third_party_startup

quiet_third_party_startup()  # before colossalai is imported

from opendit_lite.config import ConfigError, DiffusionConfig, ModelConfig, exit_on_config_error, from_dict, parse_cli
from opendit_lite.diffusion import RectifiedFlow, cfg_model_fn, create_diffusion
from opendit_lite.encoders import vae_decode
from opendit_lite.training.factory import (
    build_dataset_from_config,
    build_model_from_config,
    load_vae_from_config,
    model_input_hw,
    resolve_model_geometry,
)
from opendit_lite.checkpoint.layout import resolve_sample_checkpoint, saved_config
from opendit_lite.checkpoint.weights import load_weights


@torch.no_grad()
def sample_images(model, cfg, labels: torch.Tensor, device, generator: torch.Generator) -> torch.Tensor:
    """labels [n] -> images [n, C, H, W] in model space (latents or pixels)."""
    n, (h, w) = len(labels), model_input_hw(cfg)
    z = torch.randn(n, cfg.model.in_channels, h, w, generator=generator).to(device)
    y_null = torch.full_like(labels, cfg.model.num_classes)
    z2, y2 = torch.cat([z, z]), torch.cat([labels, y_null])  # [conditional; unconditional] for guidance
    s = cfg.sample
    if s.sampler == "euler":
        rf = RectifiedFlow(num_timesteps=cfg.diffusion.diffusion_steps)
        out = rf.sample(model, noise=z2, model_kwargs=dict(y=y2), num_steps=s.num_sampling_steps,
                        cfg_scale=s.cfg_scale, progress=True, generator=generator)
    else:
        prefix = "ddim" if s.sampler == "ddim" else ""
        diffusion = create_diffusion(f"{prefix}{s.num_sampling_steps}", noise_schedule=cfg.diffusion.noise_schedule,
                                     learn_sigma=cfg.model.learn_sigma, diffusion_steps=cfg.diffusion.diffusion_steps)
        loop = diffusion.ddim_sample_loop if s.sampler == "ddim" else diffusion.p_sample_loop
        # The reference's guidance of the first 3 channels, so original checkpoints reproduce their samples.
        guided = cfg_model_fn(model, s.cfg_scale, channels=3)
        out = loop(guided, z2.shape, z2, clip_denoised=not cfg.vae.path,  # pixels live in [-1, 1]
                   model_kwargs=dict(y=y2), progress=True, device=device, generator=generator)
    return out[:n]


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


@exit_on_config_error
def main(argv=None) -> str:
    cfg = parse_cli(sys.argv[1:] if argv is None else argv, __doc__)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ckpt = resolve_sample_checkpoint(cfg, cfg.sample.ckpt, "train.py")
    dataset = None
    vae = load_vae_from_config(cfg, device)
    saved = saved_config(ckpt)  # the resolved config train.py stored with its checkpoint
    if "model" in saved:
        cfg.model = from_dict(ModelConfig, saved["model"], "model.")
        cfg.diffusion = from_dict(DiffusionConfig, saved["diffusion"], "diffusion.")
    else:
        if cfg.model.num_classes is None:
            dataset = build_dataset_from_config(cfg)
        resolve_model_geometry(cfg, dataset, vae)
    flow = cfg.diffusion.objective == "rflow"
    if flow != (cfg.sample.sampler == "euler"):
        raise ConfigError(f"'sample.sampler'={cfg.sample.sampler!r} does not fit a model trained with "
                          f"diffusion.objective={cfg.diffusion.objective!r}: use "
                          + ("sample.sampler=euler." if flow else "sample.sampler=ddpm or ddim."))
    model = build_model_from_config(cfg)
    load_weights(model, ckpt, use_ema=cfg.sample.use_ema)
    model.to(device).eval()

    labels = cfg.sample.class_labels if cfg.sample.class_labels is not None else list(range(cfg.model.num_classes))
    bad = [lab for lab in labels if not 0 <= lab < cfg.model.num_classes]
    if bad:
        raise ConfigError(f"'sample.class_labels' {bad} are outside 0..{cfg.model.num_classes - 1}, the model's classes.")
    y = torch.tensor(labels, device=device).repeat_interleave(cfg.sample.samples_per_class)  # [rows * cols]
    generator = torch.Generator().manual_seed(cfg.sample.seed)
    images = sample_images(model, cfg, y, device, generator)
    if vae is not None:
        images = vae_decode(vae, images, cfg.vae.scale_factor)
    if dataset is None and cfg.data.type == "shapes":
        dataset = build_dataset_from_config(cfg)
    classes = getattr(dataset, "classes", None)
    names = [classes[lab] if classes else f"class {lab}" for lab in labels]
    out = cfg.sample.output or os.path.join(cfg.results_dir, cfg.exp_name, "samples.png")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    labelled_grid(images.float(), len(labels), names).save(out)
    print(f"wrote {len(y)} samples ({len(labels)} classes x {cfg.sample.samples_per_class}) from {ckpt} to {out}")
    return out


if __name__ == "__main__":
    main()
