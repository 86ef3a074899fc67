"""Image datasets: fashion_mnist, imagenet (ImageFolder layout), digits, synthetic.

Every builder returns a `DataBundle`; images flow as uint8 tensors through
torchvision transforms v2 and become normalized float32 only at the end.
"""

from __future__ import annotations

import gzip
import logging
import os
import re
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision import datasets as tvd
from torchvision import tv_tensors
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms import v2

from turbotrain.atomic import atomic_write
from turbotrain.config import ConfigError
from turbotrain.data.augment import build_op, compose, to_float
from turbotrain.data.safe import SafeDataset, collate_skipping_bad

log = logging.getLogger("turbotrain")

DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
FASHION_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


@dataclass
class DataBundle:
    train: Dataset
    val: Dataset
    num_classes: int
    in_channels: int
    image_size: int
    mean: list[float]
    std: list[float]
    class_names: list[str] = field(default_factory=list)
    kind: str = "image"
    train_eval: Dataset | None = None  # training samples with eval transforms (INT8 calibration)
    collate: Callable | None = None


class TensorImageDataset(Dataset):
    """In-memory uint8 images [N, C, H, W] with a per-sample uint8 transform (augmentation);
    `NormalizeCollate` turns whole batches into normalized float32."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform: Callable):
        self.images, self.labels = images, labels
        # no per-sample work to do: skip transforms v2's dispatch (~2 % of a small model's step)
        self.transform = None if isinstance(transform, v2.Identity) else transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        if self.transform is None:
            return self.images[i], int(self.labels[i])
        return self.transform(tv_tensors.Image(self.images[i])).as_subclass(torch.Tensor), int(self.labels[i])


class NormalizeCollate:
    """Stacks uint8 samples and normalizes the batch in one vectorized step: per-sample
    ToDtype/Normalize cost more than the model on small images (Fashion-MNIST)."""

    def __init__(self, mean: list[float], std: list[float]):
        self.mean = torch.tensor(mean).view(1, -1, 1, 1)
        self.std = torch.tensor(std).view(1, -1, 1, 1) * 255.0

    def __call__(self, batch):
        images = torch.stack([b[0] for b in batch]).float()
        return (images - self.mean * 255.0) / self.std, torch.tensor([b[1] for b in batch])


def _tensor_pipelines(cfg, native_size: int) -> tuple[v2.Compose, v2.Compose, int]:
    """uint8 -> uint8 pipelines (resize, augmentation); normalization happens per batch."""
    size = cfg.image_size or native_size
    resize = [v2.Resize(size, antialias=True)] if size != native_size else []
    train = compose([*resize, *(build_op(a) for a in cfg.augment)])
    val = compose(resize)
    return train, val, size


def _fashion_raw_dir(cfg) -> Path:
    """Resolve data.root, else the Debian copy (unpacked into the cache), else a download."""
    tried = []
    if cfg.root:
        raw = Path(os.path.expanduser(cfg.root)) / "FashionMNIST" / "raw"
        if all((raw / f).exists() for f in FASHION_FILES):
            return raw.parent.parent
        tried.append(f"data.root={cfg.root} (no FashionMNIST/raw/*-ubyte files)")
    cache = Path(os.path.expanduser(cfg.cache_dir)) / "datasets"
    raw = cache / "FashionMNIST" / "raw"
    if all((raw / f).exists() for f in FASHION_FILES):
        return cache
    if all((DEBIAN_FASHION_MNIST / f"{f}.gz").exists() for f in FASHION_FILES):
        raw.mkdir(parents=True, exist_ok=True)
        for f in FASHION_FILES:
            with gzip.open(DEBIAN_FASHION_MNIST / f"{f}.gz", "rb") as src:
                atomic_write(raw / f, lambda dst, src=src: shutil.copyfileobj(src, dst))
        return cache
    tried.append(f"{DEBIAN_FASHION_MNIST} (apt-get install dataset-fashion-mnist)")
    if cfg.download:
        try:
            tvd.FashionMNIST(str(cache), train=True, download=True)
            tvd.FashionMNIST(str(cache), train=False, download=True)
            return cache
        except Exception as e:  # network errors come in many types
            tried.append(f"torchvision download into {cache} ({type(e).__name__}: {e})")
    else:
        tried.append("download (data.download=false)")
    raise ConfigError("Fashion-MNIST not found; tried: " + "; ".join(tried))


def fashion_mnist(cfg) -> DataBundle:
    root = str(_fashion_raw_dir(cfg))
    train_ds = tvd.FashionMNIST(root, train=True, download=False)
    val_ds = tvd.FashionMNIST(root, train=False, download=False)
    train_tf, val_tf, size = _tensor_pipelines(cfg, 28)
    return DataBundle(
        train=TensorImageDataset(train_ds.data.unsqueeze(1), train_ds.targets, train_tf),
        val=TensorImageDataset(val_ds.data.unsqueeze(1), val_ds.targets, val_tf),
        train_eval=TensorImageDataset(train_ds.data.unsqueeze(1), train_ds.targets, val_tf),
        collate=NormalizeCollate(cfg.mean, cfg.std),
        num_classes=10,
        in_channels=1,
        image_size=size,
        mean=list(cfg.mean),
        std=list(cfg.std),
        class_names=list(train_ds.classes),
    )


def digits(cfg) -> DataBundle:
    from sklearn.datasets import load_digits

    d = load_digits()
    images = torch.from_numpy(d.images * (255.0 / 16.0)).round().to(torch.uint8).unsqueeze(1)
    labels = torch.from_numpy(d.target).long()
    g = torch.Generator().manual_seed(1234)  # fixed split, independent of trainer.seed
    perm = torch.randperm(len(labels), generator=g)
    n_val = int(len(labels) * cfg.val_fraction)
    val_idx, train_idx = perm[:n_val], perm[n_val:]
    train_tf, val_tf, size = _tensor_pipelines(cfg, 8)
    return DataBundle(
        train=TensorImageDataset(images[train_idx], labels[train_idx], train_tf),
        val=TensorImageDataset(images[val_idx], labels[val_idx], val_tf),
        train_eval=TensorImageDataset(images[train_idx], labels[train_idx], val_tf),
        collate=NormalizeCollate(cfg.mean, cfg.std),
        num_classes=10,
        in_channels=1,
        image_size=size,
        mean=list(cfg.mean),
        std=list(cfg.std),
        class_names=[str(i) for i in range(10)],
    )


def synthetic(cfg) -> DataBundle:
    """Random pixels and labels: only for shapes and speed."""
    size = cfg.image_size or 32
    g = torch.Generator().manual_seed(cfg.num_samples)
    shape = (cfg.num_samples, cfg.channels, size, size)
    images = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    labels = torch.randint(0, cfg.num_classes, (cfg.num_samples,), generator=g)
    mean = list(cfg.mean) * (cfg.channels if len(cfg.mean) == 1 else 1)
    std = list(cfg.std) * (cfg.channels if len(cfg.std) == 1 else 1)
    tf = compose([])
    n_val = max(1, cfg.num_samples // 5)
    return DataBundle(
        train=TensorImageDataset(images[n_val:], labels[n_val:], tf),
        val=TensorImageDataset(images[:n_val], labels[:n_val], tf),
        train_eval=TensorImageDataset(images[n_val:], labels[n_val:], tf),
        collate=NormalizeCollate(mean, std),
        num_classes=cfg.num_classes,
        in_channels=cfg.channels,
        image_size=size,
        mean=mean,
        std=std,
        class_names=[str(i) for i in range(cfg.num_classes)],
    )


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


def imagenet(cfg) -> DataBundle:
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


BUILDERS = {"fashion_mnist": fashion_mnist, "imagenet": imagenet, "digits": digits, "synthetic": synthetic}
