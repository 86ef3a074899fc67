"""data=imagenet: an image folder tree (ImageNet layout: <root>/train/<class>/*.jpg,
<root>/val/<class>/*.jpg), each split listed once (data/listing.py) and read through the shared
encoded-image pipeline (data/encoded.py). `EncodedImagesConfig` holds the keys every option of
encoded images has (the folder tree, tar shards, Hugging Face datasets)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from turbotrain.core.schema import POSITIVE, ConfigError, setting
from turbotrain.data.bundle import DATA, DataBundle
from turbotrain.data.encoded import image_bundle
from turbotrain.data.listing import FolderSource, load_listing
from turbotrain.data.vision import DataConfig


@dataclass
class EncodedImagesConfig(DataConfig):
    root: str | None = None  # required: where the data lives
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


@dataclass
class ImageFolderConfig(EncodedImagesConfig):
    # saved: reuse the split's listing while its directories keep their mtimes (data/listing.py);
    # rescan: list every file again (a file rewritten in place under the same name)
    index: str = setting("saved", choices=("saved", "rescan"), numeric=False)


def required_root(cfg, layout: str) -> Path:
    """data.root, checked to be given and to be a directory: `layout` says what it should hold."""
    if not cfg.root or cfg.root == "???":
        raise ConfigError(f"data.root is required for data={cfg.name} ({layout})")
    root = Path(os.path.expanduser(cfg.root))
    if not root.is_dir():
        raise ConfigError(f"data.root={cfg.root}: no such directory (data={cfg.name} expects {layout})")
    return root


def _split(cfg, root: Path, split: str) -> FolderSource:
    source = FolderSource(load_listing(root / split, Path(os.path.expanduser(cfg.cache_dir)) / "index", cfg.index == "rescan"))
    if not source.classes:
        raise ConfigError(f"data.root={cfg.root}: no class folders in {root / split}/ (expected {split}/<class>/*.jpg)")
    return source


@DATA.register("imagenet", ImageFolderConfig, kind="image")
def imagenet(cfg, tokenizer=None) -> DataBundle:
    root = required_root(cfg, "a dir with train/ and val/")
    for split in ("train", "val"):
        if not (root / split).is_dir():
            raise ConfigError(f"data.root={cfg.root}: missing {root / split}/<class>/*.jpg")
    return image_bundle(cfg, root.resolve().name, _split(cfg, root, "train"), _split(cfg, root, "val"))
