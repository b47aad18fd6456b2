"""An image folder with one sub-folder per class, cropped the way DiT crops ImageNet."""

import os
import sys

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


class ImageFolderDataset(datasets.ImageFolder):
    """torchvision's ImageFolder that names the file behind an index (for bad-sample warnings) and
    drops empty files when listing (a cheap scan: names and sizes, no decoding)."""

    def __init__(self, root: str, transform=None):
        try:
            super().__init__(root, transform=transform)
        except (FileNotFoundError, OSError) as e:  # no class sub-folders, or no image in them
            raise ValueError(f"no images found under {root!r}: expected <path>/<class name>/<image files> "
                             f"({e})") from None
        empty = [path for path, _ in self.samples if os.path.getsize(path) == 0]
        if empty:
            print(f"warning: skipping {len(empty)} empty image file(s), e.g. {empty[0]}", file=sys.stderr)
            self.samples = [s for s in self.samples if s[0] not in set(empty)]
            self.imgs, self.targets = self.samples, [t for _, t in self.samples]

    def sample_path(self, index: int) -> str:
        return self.samples[index][0]


def build_image_folder(path: str, image_size: int, random_flip: bool = True) -> ImageFolderDataset:
    ds = ImageFolderDataset(path, transform=image_transform(image_size, random_flip))
    if len(ds) == 0:
        raise ValueError(f"no images found under {path!r}: expected <path>/<class name>/<image files>")
    return ds


__all__ = ["center_crop_arr", "image_transform", "build_image_folder", "ImageFolderDataset"]
