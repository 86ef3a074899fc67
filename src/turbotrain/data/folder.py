"""Image folder trees (ImageNet layout: <root>/train/<class>/*.jpg, <root>/val/<class>/*.jpg),
decoded per sample with torchvision.io; files that fail are bad samples (data/safe.py)."""

from __future__ import annotations

import copy
import logging
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision import datasets as tvd
from torchvision import tv_tensors
from torchvision.io import ImageReadMode, decode_image, decode_jpeg, read_file
from torchvision.transforms import v2

from turbotrain.core.schema import POSITIVE, ConfigError, setting
from turbotrain.data.augment import build_op, compose, to_float
from turbotrain.data.batched import batch_pipeline
from turbotrain.data.bundle import DATA, DataBundle, class_files
from turbotrain.data.cache import CachedImages, open_cache
from turbotrain.data.safe import SafeDataset, collate_skipping_bad
from turbotrain.data.vision import DataConfig, ImageBatch, NormalizeCollate

log = logging.getLogger("turbotrain")


@dataclass
class ImageFolderConfig(DataConfig):
    root: str | None = None  # required: the tree's top folder
    batch_size: int = setting(64, bound=POSITIVE)
    image_size: int | None = setting(224, bound=POSITIVE)
    resolution_step: int = setting(32, bound=POSITIVE)
    mean: list[float] = setting(factory=lambda: [0.485, 0.456, 0.406])
    std: list[float] = setting(bound=POSITIVE, factory=lambda: [0.229, 0.224, 0.225])
    cache: str = setting("none", choices=("none", "raw", "jpeg"))  # decode once into data.cache_dir (data/cache.py)
    # the training split's shorter side in the cache, at most; None: 2 x image_size, so that
    # RandomResizedCrop's smaller crops are not enlarged from a thumbnail (the validation split is
    # stored at the eval resize, what evaluation reads)
    cache_size: int | None = setting(None, bound=POSITIVE)
    decode: str = setting("cpu", choices=("cpu", "gpu"))  # gpu: training JPEGs decoded in batches by nvJPEG


class GpuDecodedTrain(Dataset):
    """data.decode=gpu (no cache): a training batch's JPEG files decoded in one nvJPEG call
    (torchvision.io.decode_jpeg on CUDA), then cropped, resized and augmented as a batch on the
    GPU. A batch that fails to decode is decoded file by file; files that fail, and files whose
    header declares more than data.max_image_pixels (checked before anything is decoded), are
    dropped and counted (the third element of the batch), as bad samples are on the CPU path."""

    def __init__(self, folder: tvd.ImageFolder, size: int, ops: list[v2.Transform], reader: RGBReader):
        self.samples, self.augment = folder.samples, batch_pipeline([v2.RandomResizedCrop(size, antialias=True), *ops])
        self.reader, self.device = reader, torch.device("cuda")

    def __len__(self) -> int:
        return len(self.samples)

    def _decode(self, paths: list[str]) -> list[torch.Tensor | None]:
        refused = {p: why for p in paths if (why := self.reader.refusal(p))}
        for path, why in refused.items():
            log.warning("bad sample %s: %s (skipped)", path, why)
        decoded = iter(self._decode_files([read_file(p) for p in paths if p not in refused]))
        return [None if p in refused else next(decoded) for p in paths]

    def _decode_files(self, files: list[torch.Tensor]) -> list[torch.Tensor | None]:
        if not files:
            return []
        try:
            return decode_jpeg(files, mode=ImageReadMode.RGB, device=self.device)
        except RuntimeError:
            out = []
            for f in files:
                try:
                    out.append(decode_jpeg(f, mode=ImageReadMode.RGB, device=self.device))
                except RuntimeError:
                    out.append(None)
            return out

    def __getitems__(self, indices: list[int]):
        decoded = self._decode([self.samples[i][0] for i in indices])
        kept = [k for k, image in enumerate(decoded) if image is not None]
        images = self.augment([decoded[k] for k in kept])
        labels = torch.tensor([self.samples[indices[k]][1] for k in kept], device=self.device)
        return ImageBatch(images, labels), len(indices) - len(kept)

    def __getitem__(self, i: int):
        return self.__getitems__([i])


class GpuCollate:
    """data.decode=gpu: training batches (already on the GPU) are normalized there and keep their
    count of dropped files; evaluation batches take the CPU path's collate."""

    def __init__(self, normalize: NormalizeCollate, fallback):
        self.normalize, self.fallback = normalize, fallback

    def __call__(self, batch):
        if isinstance(batch, tuple) and isinstance(batch[0], ImageBatch):
            images, labels = self.normalize(batch[0])
            return images, labels, batch[1]
        return self.fallback(batch)


def _check_gpu_decode(cfg) -> None:
    if cfg.decode != "gpu":
        return
    if not torch.cuda.is_available():
        raise ConfigError("data.decode=gpu needs CUDA (nvJPEG) and this machine has none: use data.decode=cpu")
    if cfg.cache != "none":
        raise ConfigError(f"data.decode=gpu decodes the JPEG files themselves: it needs data.cache=none, not {cfg.cache}")


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
        return ImageBatch(self.augment(self.cache.load(indices)), self.cache.labels[indices])


class CachedEval(CacheView):
    """Evaluation view of a cache: the eval resize (nothing to do for images stored at it) and center crop."""

    def __init__(self, cache: CachedImages, size: int, resize: int):
        super().__init__(cache, compose([v2.Resize(resize, antialias=True), v2.CenterCrop(size)]))

    def __getitems__(self, indices: list[int]) -> ImageBatch:
        crops = [self._one(image) for image in self.cache.load(indices)]
        return ImageBatch(torch.stack(crops), self.cache.labels[indices])


def _cached(cfg, splits: dict[str, tvd.ImageFolder], reader, size: int):
    """(train, val, train_eval) datasets over the decoded cache of each split."""
    resize = int(round(size / 0.875))
    sides = {"train": cfg.cache_size or 2 * size, "val": resize}
    root = Path(os.path.expanduser(cfg.cache_dir)) / "decoded"
    name = Path(os.path.expanduser(cfg.root)).resolve().name
    caches = {k: open_cache(root, f"{name}-{k}", ds.samples, reader, cfg.cache, sides[k]) for k, ds in splits.items()}
    ops = [build_op(a) for a in cfg.augment]
    return (
        CachedTrain(caches["train"], size, ops),
        CachedEval(caches["val"], size, resize),
        CachedEval(caches["train"], size, resize),
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

    def refusal(self, path: str) -> str | None:
        """Why the file is refused before decoding, or None."""
        if self.max_pixels is not None and (pixels := _declared_pixels(path)) > self.max_pixels:
            return f"declares {pixels} pixels, more than data.max_image_pixels={self.max_pixels}"
        return None

    def __call__(self, path: str) -> torch.Tensor:
        if why := self.refusal(path):
            raise ValueError(why)
        return tv_tensors.Image(decode_image(path, mode=ImageReadMode.RGB))


@DATA.register("imagenet", ImageFolderConfig, kind="image")
def imagenet(cfg, tokenizer=None) -> DataBundle:
    _check_gpu_decode(cfg)
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
    train_listed = copy.copy(train)  # the training files with eval transforms: the same listing, not a second one
    train_listed.transform = val_tf
    if train.classes != val.classes:
        raise ConfigError(f"data.root={cfg.root}: train/ and val/ have different class folders")
    empty = sorted(set(train.classes) - {train.classes[t] for t in train.targets})
    if empty:
        log.warning("data.root=%s: class folders with no images in train/: %s", cfg.root, ", ".join(empty))
    if cfg.cache != "none":
        train_ds, val_ds, train_eval = _cached(cfg, {"train": train, "val": val}, reader, size)
        collate = NormalizeCollate(cfg.mean, cfg.std)
    elif cfg.decode == "gpu":  # training batches on the GPU; evaluation decodes on the CPU as before
        gpu = GpuDecodedTrain(train, size, [build_op(a) for a in cfg.augment], reader)
        train_eval = SafeDataset(train_listed, cfg.on_bad_sample, lambda i: train.samples[i][0])
        train_ds, val_ds = gpu, SafeDataset(val, cfg.on_bad_sample, lambda i: val.samples[i][0])
        collate = GpuCollate(NormalizeCollate(cfg.mean, cfg.std), collate_skipping_bad)
    else:

        def safe(ds: tvd.ImageFolder) -> SafeDataset:
            return SafeDataset(ds, cfg.on_bad_sample, lambda i: ds.samples[i][0])

        train_ds, val_ds, train_eval, collate = safe(train), safe(val), safe(train_listed), collate_skipping_bad
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
        class_files=class_files(train.samples, train.classes),
        batches_on_device=cfg.decode == "gpu",
    )
