"""In-memory image datasets: fashion_mnist, digits, synthetic, and the image data schema.

Every builder returns a `DataBundle`; images flow as uint8 tensors through
torchvision transforms v2 and become normalized float32 only at the end.
"""

from __future__ import annotations

import gzip
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch.utils.data import Dataset
from torchvision import datasets as tvd
from torchvision import tv_tensors
from torchvision.transforms import v2

from turbotrain.core.atomic import atomic_write
from turbotrain.core.schema import POSITIVE, UNIT_OPEN, ConfigError, setting
from turbotrain.data.augment import build_op, compose
from turbotrain.data.batched import batch_pipeline, ops_of
from turbotrain.data.bundle import DATA, DataBundle, DataCommon

log = logging.getLogger("turbotrain")


@dataclass
class DataConfig(DataCommon):
    """Image data. Its defaults are the default dataset's (Fashion-MNIST); other image options
    subclass it with their own."""

    image_size: int | None = setting(None, bound=POSITIVE)  # None: the dataset's native size
    resolution: str = setting("fixed", choices=("fixed", "dynamic", "progressive"))  # training only; eval stays nominal
    resolution_scale: list[float] = setting(bound=POSITIVE, factory=lambda: [0.8, 1.2])  # dynamic: random scale range
    resolution_step: int = setting(4, bound=POSITIVE)  # sizes are multiples of this
    progressive_start: float = 0.5  # progressive: scale until progressive_from of training,
    progressive_from: float = 0.5  # then a linear ramp,
    progressive_until: float = 0.8  # reaching full size at this fraction of training
    max_image_pixels: int | None = setting(89_478_485, bound=POSITIVE)  # PIL's limit: larger files are bad samples
    # training augmentation: torchvision transforms v2 by class name, with their arguments (or AlternatingHorizontalFlip)
    augment: list[Any] = setting(factory=lambda: [{"name": "RandomHorizontalFlip", "p": 0.5}])
    mean: list[float] = setting(factory=lambda: [0.2860])  # per-channel normalization mean
    std: list[float] = setting(bound=POSITIVE, factory=lambda: [0.3530])  # per-channel normalization standard deviation


@dataclass
class DigitsConfig(DataConfig):
    batch_size: int = setting(64, bound=POSITIVE)
    resolution_step: int = setting(32, bound=POSITIVE)
    augment: list[Any] = setting(factory=list)
    mean: list[float] = setting(factory=lambda: [0.3])
    std: list[float] = setting(bound=POSITIVE, factory=lambda: [0.38])
    val_fraction: float = setting(0.2, bound=UNIT_OPEN)  # share of the 1,797 digits held out for validation


@dataclass
class SyntheticConfig(DigitsConfig):
    image_size: int | None = setting(32, bound=POSITIVE)
    mean: list[float] = setting(factory=lambda: [0.5])
    std: list[float] = setting(bound=POSITIVE, factory=lambda: [0.29])
    num_samples: int = setting(1024, bound=POSITIVE)  # training samples
    num_classes: int = setting(10, bound=(2, None, True, False))  # number of classes
    channels: int = setting(3, bound=POSITIVE)  # image channels


DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
FASHION_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


class ImageBatch(NamedTuple):
    """A whole batch taken from a tensor store: uint8 images [N, C, H, W] and labels [N]."""

    images: torch.Tensor
    labels: torch.Tensor


class TensorImageDataset(Dataset):
    """In-memory uint8 images [N, C, H, W] with a uint8 transform (augmentation). The loader
    takes a batch with one index into the store (`__getitems__`) and augments it as a batch
    (data/batched.py); `NormalizeCollate` turns it into normalized float32."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform: Callable):
        self.images, self.labels = images, labels
        # no per-sample work to do: skip transforms v2's dispatch (~2 % of a small model's step)
        self.transform = None if isinstance(transform, v2.Identity) else transform
        self.batch_transform = batch_pipeline(ops_of(transform))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        if self.transform is None:
            return self.images[i], int(self.labels[i])
        return self.transform(tv_tensors.Image(self.images[i])).as_subclass(torch.Tensor), int(self.labels[i])

    def __getitems__(self, indices: list[int]) -> ImageBatch:
        index = torch.as_tensor(indices, dtype=torch.long)
        images = self.images[index]
        return ImageBatch(self.batch_transform(images, indices) if self.batch_transform else images, self.labels[index])


class NormalizeCollate:
    """Normalizes a batch in one vectorized step (per-sample ToDtype/Normalize cost more than the
    model on small images); takes an ImageBatch, or a list of (image, label) samples."""

    def __init__(self, mean: list[float], std: list[float]):
        self.shift = torch.tensor(mean).view(1, -1, 1, 1) * 255.0
        self.std = torch.tensor(std).view(1, -1, 1, 1) * 255.0

    def __call__(self, batch):
        if isinstance(batch, ImageBatch):
            images, labels = batch.images, batch.labels
        else:
            images, labels = torch.stack([b[0] for b in batch]), torch.tensor([b[1] for b in batch])
        # normalized in place (never the store's own tensor), in the layout models expect
        images = images.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
        shift, std = self._on(images.device)
        return images.sub_(shift).div_(std), labels

    def _on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The constants on `device`, copied there once (a copy per batch waits for the GPU)."""
        if self.shift.device != device:
            self.shift, self.std = self.shift.to(device), self.std.to(device)
        return self.shift, self.std


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


@DATA.register("fashion_mnist", DataConfig, kind="image")
def fashion_mnist(cfg, tokenizer=None) -> DataBundle:
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


@DATA.register("digits", DigitsConfig, kind="image")
def digits(cfg, tokenizer=None) -> DataBundle:
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


@DATA.register("synthetic", SyntheticConfig, kind="image")
def synthetic(cfg, tokenizer=None) -> DataBundle:
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
