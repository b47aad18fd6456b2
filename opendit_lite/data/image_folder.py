"""An image folder with one sub-folder per class, cropped the way DiT crops ImageNet."""

import numpy as np
from PIL import Image
from torchvision import datasets, transforms


def center_crop_arr(pil_image: Image.Image, image_size: int) -> Image.Image:
    """DiT's ADM-style centre crop: halve with a box filter while the short side is at least twice the
    target (cheap, alias-free), resize bicubically so the short side equals ``image_size``, then
    take the central ``image_size`` square."""
    while min(pil_image.size) >= 2 * image_size:
        pil_image = pil_image.resize(tuple(s // 2 for s in pil_image.size), resample=Image.BOX)
    scale = image_size / min(pil_image.size)
    pil_image = pil_image.resize(tuple(round(s * scale) for s in pil_image.size), resample=Image.BICUBIC)
    arr = np.array(pil_image)
    top = (arr.shape[0] - image_size) // 2
    left = (arr.shape[1] - image_size) // 2
    return Image.fromarray(arr[top: top + image_size, left: left + image_size])


def image_transform(image_size: int, random_flip: bool = True) -> transforms.Compose:
    """PIL image -> [3, S, S] tensor in [-1, 1]."""
    steps = [transforms.Lambda(lambda im: center_crop_arr(im.convert("RGB"), image_size))]
    if random_flip:
        steps.append(transforms.RandomHorizontalFlip())
    steps += [transforms.ToTensor(), transforms.Normalize([0.5] * 3, [0.5] * 3, inplace=True)]
    return transforms.Compose(steps)


def build_image_folder(path: str, image_size: int, random_flip: bool = True) -> datasets.ImageFolder:
    ds = datasets.ImageFolder(path, transform=image_transform(image_size, random_flip))
    if len(ds) == 0:
        raise ValueError(f"no images found under {path!r}: expected <path>/<class name>/<image files>")
    return ds


__all__ = ["center_crop_arr", "image_transform", "build_image_folder"]
