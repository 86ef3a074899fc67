"""Image folder trees (ImageNet layout: <root>/train/<class>/*.jpg, <root>/val/<class>/*.jpg),
decoded per sample with torchvision.io; files that fail are bad samples (data/safe.py)."""

from __future__ import annotations

import logging
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image
from torchvision import datasets as tvd
from torchvision import tv_tensors
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms import v2

from turbotrain.data.augment import build_op, compose, to_float
from turbotrain.data.bundle import DATA, DataBundle
from turbotrain.data.safe import SafeDataset, collate_skipping_bad
from turbotrain.data.vision import DataConfig
from turbotrain.schema import POSITIVE, ConfigError, setting

log = logging.getLogger("turbotrain")


@dataclass
class ImageFolderConfig(DataConfig):
    root: str | None = None  # required: the tree's top folder
    batch_size: int = setting(64, bound=POSITIVE)
    image_size: int | None = setting(224, bound=POSITIVE)
    resolution_step: int = setting(32, bound=POSITIVE)
    mean: list[float] = setting(factory=lambda: [0.485, 0.456, 0.406])
    std: list[float] = setting(bound=POSITIVE, factory=lambda: [0.229, 0.224, 0.225])


def _declared_pixels(path: str) -> int:
    """Width x height from the file's header; nothing is decoded."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            with Image.open(path) as im:
                w, h = im.size
        except Image.DecompressionBombError as e:  # PIL's own limit (2x its default) came first
            return int(re.search(r"\((\d+) pixels\)", str(e)).group(1))
    return w * h


class RGBReader:
    """Decode with torchvision.io (libjpeg-turbo) straight to a uint8 CHW tensor, after reading the
    size the file declares: a few hundred bytes claiming 60000x60000 pixels would otherwise make
    the decoder allocate ~10 GB. Such a file is a bad sample (skipped and named, or an error)."""

    def __init__(self, max_pixels: int | None):
        self.max_pixels = max_pixels

    def __call__(self, path: str) -> torch.Tensor:
        if self.max_pixels is not None and (pixels := _declared_pixels(path)) > self.max_pixels:
            raise ValueError(f"declares {pixels} pixels, more than data.max_image_pixels={self.max_pixels}")
        return tv_tensors.Image(decode_image(path, mode=ImageReadMode.RGB))


@DATA.register("imagenet", ImageFolderConfig, kind="image")
def imagenet(cfg, tokenizer=None) -> DataBundle:
    if not cfg.root or cfg.root == "???":
        raise ConfigError("data.root is required for data=imagenet (a dir with train/ and val/)")
    root = Path(os.path.expanduser(cfg.root))
    for split in ("train", "val"):
        if not (root / split).is_dir():
            raise ConfigError(f"data.root={cfg.root}: missing {root / split}/<class>/*.jpg")
    size = cfg.image_size or 224
    norm = to_float(cfg.mean, cfg.std)
    train_tf = compose([v2.RandomResizedCrop(size, antialias=True), *(build_op(a) for a in cfg.augment), *norm])
    val_tf = compose([v2.Resize(int(round(size / 0.875)), antialias=True), v2.CenterCrop(size), *norm])
    skip = cfg.on_bad_sample == "skip"
    reader = RGBReader(cfg.max_image_pixels)

    def folder(split: str, tf) -> tvd.ImageFolder:
        try:
            return tvd.ImageFolder(str(root / split), transform=tf, loader=reader, allow_empty=skip)
        except FileNotFoundError as e:  # an empty class folder, or no images at all
            raise ConfigError(f"data.root={cfg.root}: {e} (data.on_bad_sample=skip allows empty classes)") from e

    train, val = folder("train", train_tf), folder("val", val_tf)
    if train.classes != val.classes:
        raise ConfigError(f"data.root={cfg.root}: train/ and val/ have different class folders")
    empty = sorted(set(train.classes) - {train.classes[t] for t in train.targets})
    if empty:
        log.warning("data.root=%s: class folders with no images in train/: %s", cfg.root, ", ".join(empty))
    train_eval = folder("train", val_tf)

    def safe(ds: tvd.ImageFolder) -> SafeDataset:
        return SafeDataset(ds, cfg.on_bad_sample, lambda i: ds.samples[i][0])

    return DataBundle(
        train=safe(train),
        val=safe(val),
        train_eval=safe(train_eval),
        collate=collate_skipping_bad,
        num_classes=len(train.classes),
        in_channels=3,
        image_size=size,
        mean=list(cfg.mean),
        std=list(cfg.std),
        class_names=list(train.classes),
    )
