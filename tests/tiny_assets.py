"""Small stand-ins for real assets, built in-process: a randomly initialised AutoencoderKL saved
like a downloaded one, and an image folder with one sub-folder per class."""

import os

from PIL import Image


def save_tiny_vae(path) -> str:
    """A 2-level AutoencoderKL (downsamples by 2, 4 latent channels) written with save_pretrained."""
    from diffusers.models import AutoencoderKL

    vae = AutoencoderKL(block_out_channels=(8, 8), down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4, norm_num_groups=4,
                        layers_per_block=1)
    vae.save_pretrained(path)
    return str(path)


def write_image_folder(root, classes=("a", "b"), per_class: int = 3, size: int = 20) -> str:
    """``root/<class>/<i>.png`` solid-colour images whose colour depends on class and index."""
    for c, name in enumerate(classes):
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for i in range(per_class):
            Image.new("RGB", (size, size), (i * 60 % 256, 30, 120 if c == 0 else 10)).save(
                os.path.join(root, name, f"{i}.png"))
    return str(root)
