"""Datasets of encoded images (JPEG/PNG bytes) from any indexed source: an image folder tree, tar
shards, a Hugging Face dataset. A source lists a split once into arrays (labels, where each image's
bytes are); `image_bundle` turns a train and a val source into the run's datasets, decoded per
sample on the CPU, through the decoded cache (data.cache), or in batches by nvJPEG (data.decode=gpu,
data/device_decode.py),
the same for every source. Images that fail are bad samples (data/safe.py), named by the source."""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision import tv_tensors
from torchvision.transforms import v2

from turbotrain.core.schema import ConfigError
from turbotrain.data.augment import build_op, compose, to_float
from turbotrain.data.batched import batch_pipeline
from turbotrain.data.bundle import DataBundle
from turbotrain.data.cache import CachedImages, open_cache
from turbotrain.data.decode import RGBReader
from turbotrain.data.device_decode import DeviceDecode, EncodedTrain, PassEncoded, check_gpu_decode
from turbotrain.data.safe import DataError, SafeDataset, collate_skipping_bad
from turbotrain.data.vision import ImageBatch, NormalizeCollate

log = logging.getLogger("turbotrain")


class ImageSource:
    """One split's images, indexed. Subclasses set `classes`, `labels` (int64 array), `fingerprint`
    (names these exact bytes: cache names) and `class_files` (per class, a digest a resume checks;
    None where the source has none), and give `encoded(i)` (the image's bytes, a uint8 tensor) and
    `name(i)` (what a message calls it: a path, shard:member, split row). Arrays, not Python lists:
    loader workers read them without touching a refcount, so their pages stay shared."""

    classes: list[str]
    labels: np.ndarray
    fingerprint: str
    class_files: dict[str, str] | None = None
    left_out: int = 0  # samples the listing found malformed and left out (each named in a warning)

    def __len__(self) -> int:
        return len(self.labels)

    def encoded(self, i: int) -> torch.Tensor:
        raise NotImplementedError

    def name(self, i: int) -> str:
        raise NotImplementedError


class DecodedImages(Dataset):
    """A source's images decoded and transformed one at a time: (image, label)."""

    def __init__(self, source: ImageSource, reader: RGBReader, transform: v2.Transform):
        self.source, self.reader, self.transform = source, reader, transform

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int):
        return self.transform(self.reader(self.source.encoded(i))), int(self.source.labels[i])


class CacheView(Dataset):
    """A cache's images through `per_sample` (uint8 -> uint8), one at a time; subclasses add the
    whole-batch path (`__getitems__`)."""

    def __init__(self, cache: CachedImages, per_sample: v2.Transform):
        self.cache, self.per_sample = cache, per_sample

    def __len__(self) -> int:
        return len(self.cache)

    def _one(self, image: torch.Tensor) -> torch.Tensor:
        return self.per_sample(tv_tensors.Image(image)).as_subclass(torch.Tensor)

    def __getitem__(self, i: int):
        image, label = self.cache[i]
        return self._one(image), label


class CachedTrain(CacheView):
    """Training view of a cache: RandomResizedCrop then `ops`, per sample or for a whole batch
    (data/batched.py) with the same draws."""

    def __init__(self, cache: CachedImages, size: int, ops: list[v2.Transform]):
        ops = [v2.RandomResizedCrop(size, antialias=True), *ops]
        super().__init__(cache, compose(ops))
        self.augment = batch_pipeline(ops)

    def __getitems__(self, indices: list[int]) -> ImageBatch:
        return ImageBatch(self.augment(self.cache.load(indices), indices), self.cache.labels[indices])


class CachedEval(CacheView):
    """Evaluation view of a cache: the eval resize (nothing to do for images stored at it) and center crop."""

    def __init__(self, cache: CachedImages, size: int, resize: int):
        super().__init__(cache, compose([v2.Resize(resize, antialias=True), v2.CenterCrop(size)]))

    def __getitems__(self, indices: list[int]) -> ImageBatch:
        crops = [self._one(image) for image in self.cache.load(indices)]
        return ImageBatch(torch.stack(crops), self.cache.labels[indices])


def _cached(cfg, name: str, splits: dict[str, ImageSource], reader: RGBReader, size: int):
    """(train, val, train_eval) datasets over the decoded cache of each split, and how many files
    the caches left out because they failed to decode (a file is decoded once, so counted once)."""
    resize = int(round(size / 0.875))
    sides = {"train": cfg.cache_size or 2 * size, "val": resize}
    root = Path(os.path.expanduser(cfg.cache_dir)) / "decoded"
    caches = {k: open_cache(root, f"{name}-{k}", src, reader, cfg.cache, sides[k]) for k, src in splits.items()}
    bad = [b for cache in caches.values() for b in cache.bad]
    if bad and cfg.on_bad_sample == "error":
        raise DataError(f"bad sample {bad[0]} in the decoded cache (data.on_bad_sample=skip leaves it out)")
    ops = [build_op(a) for a in cfg.augment]
    datasets = (CachedTrain(caches["train"], size, ops), CachedEval(caches["val"], size, resize))
    return (*datasets, CachedEval(caches["train"], size, resize), len(bad))


def image_bundle(cfg, name: str, train: ImageSource, val: ImageSource) -> DataBundle:
    """The run's datasets over a train and a val source. `name` names the data in the cache's folder names."""
    check_gpu_decode(cfg)
    if train.classes != val.classes:
        raise ConfigError(f"data={cfg.name} (data.root={cfg.root}): the training and validation splits have different classes")
    empty = sorted(set(train.classes) - {train.classes[t] for t in np.unique(train.labels)})
    if empty and cfg.on_bad_sample == "error":
        raise ConfigError(
            f"data.root={cfg.root}: classes with no training images: {', '.join(empty)} (data.on_bad_sample=skip allows them)"
        )
    if empty:
        log.warning("data.root=%s: classes with no training images: %s", cfg.root, ", ".join(empty))
    size = cfg.image_size or 224
    norm = to_float(cfg.mean, cfg.std)
    train_tf = compose([v2.RandomResizedCrop(size, antialias=True), *(build_op(a) for a in cfg.augment), *norm])
    val_tf = compose([v2.Resize(int(round(size / 0.875)), antialias=True), v2.CenterCrop(size), *norm])
    reader = RGBReader(cfg.max_image_pixels)

    def safe(source: ImageSource, tf) -> SafeDataset:
        return SafeDataset(DecodedImages(source, reader, tf), cfg.on_bad_sample, source.name)

    on_device, cache_left_out = None, 0
    if cfg.cache != "none":
        train_ds, val_ds, train_eval, cache_left_out = _cached(cfg, name, {"train": train, "val": val}, reader, size)
        collate = NormalizeCollate(cfg.mean, cfg.std)
    else:  # train_eval: the training images with eval transforms, the same listing
        train_eval, val_ds = safe(train, val_tf), safe(val, val_tf)
        if cfg.decode == "gpu":  # training batches decoded on the GPU; evaluation on the CPU as before
            pipeline = batch_pipeline([v2.RandomResizedCrop(size, antialias=True), *(build_op(a) for a in cfg.augment)])
            train_ds, collate = EncodedTrain(train, pipeline, reader), PassEncoded(collate_skipping_bad)
            on_device = functools.partial(DeviceDecode, pipeline=pipeline, normalize=NormalizeCollate(cfg.mean, cfg.std))
        else:
            train_ds, collate = safe(train, train_tf), collate_skipping_bad
    return DataBundle(
        train=train_ds,
        val=val_ds,
        train_eval=train_eval,
        collate=collate,
        num_classes=len(train.classes),
        in_channels=3,
        image_size=size,
        mean=list(cfg.mean),
        std=list(cfg.std),
        class_names=list(train.classes),
        class_files=train.class_files,
        train_on_device=on_device,
        bad_indexed=train.left_out + val.left_out + cache_left_out,
    )
