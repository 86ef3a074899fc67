"""data=hf_images: an image classification dataset in Hugging Face `datasets` format: a folder
written by `save_to_disk` (data.format=disk), Parquet files (parquet: the Hub's layout,
train-*.parquet, data/validation-*.parquet, ...), or an image folder read by datasets' own
builder (imagefolder). Rows are memory-mapped Arrow; each image is decoded from its bytes with
torchvision.io, never through PIL's per-row decode. Labels and class names come from the label
column's ClassLabel feature (its integers as names where it has none)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torchvision.io import read_file

from turbotrain.core.schema import ConfigError, setting
from turbotrain.data.bundle import DATA, DataBundle
from turbotrain.data.encoded import ImageSource, image_bundle
from turbotrain.data.folder import EncodedImagesConfig, required_root

log = logging.getLogger("turbotrain")


@dataclass
class HFImagesConfig(EncodedImagesConfig):
    # how data.root is stored: a save_to_disk folder, Parquet files or an imagefolder tree
    format: str = setting("disk", choices=("disk", "parquet", "imagefolder"), numeric=False)
    train_split: str = "train"  # the split to train on
    val_split: str = "validation"  # the split to validate on
    image_column: str = "image"  # the column holding the images
    label_column: str = "label"  # the column holding the class labels (a ClassLabel or integers)


class ArrowSource(ImageSource):
    """One split of a `datasets.Dataset`: its image column as the memory-mapped Arrow column
    ({"bytes", "path"} per row, read in place: a cast of it would copy every image into memory),
    labels as an array."""

    def __init__(self, ds, split: str, image_column: str, label_column: str):
        """`ds` as loaded from storage: a view's row selection (`ds._indices`) is not read, and
        datasets writes views out whole (save_to_disk flattens them)."""
        import datasets

        feature = ds.features[label_column]
        # a null label (or ClassLabel's -1, "no label") is a row left out, not a garbage integer
        labels = np.asarray(ds.data.column(label_column).fill_null(-1).to_numpy(), dtype=np.int64)
        self.rows = np.flatnonzero(labels >= 0)
        self.labels, self.left_out = labels[self.rows], len(labels) - len(self.rows)
        if self.left_out:
            first = ", ".join(str(r) for r in np.flatnonzero(labels < 0)[:5])
            log.warning("split %s: %d row(s) without a label left out (rows %s...)", split, self.left_out, first)
        top = int(self.labels.max()) if len(self.labels) else -1
        self.named = isinstance(feature, datasets.ClassLabel)
        self.classes = list(feature.names) if self.named else [str(k) for k in range(top + 1)]
        self.images, self.split, self.fingerprint = ds.data.column(image_column), split, ds._fingerprint

    def name(self, i: int) -> str:
        return f"split {self.split} row {self.rows[i]}"

    def encoded(self, i: int) -> torch.Tensor:
        image = self.images[int(self.rows[i])]
        if image.is_valid and (data := image["bytes"].as_py()) is not None:
            return torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if image.is_valid and (path := image["path"].as_py()):
            return read_file(path)
        raise ValueError("the row has no image (neither bytes nor a path)")


def _load(cfg, root: Path):
    """The DatasetDict at data.root, in data.format."""
    import datasets

    try:
        if cfg.format == "disk":
            loaded = datasets.load_from_disk(str(root))
        else:
            cache = Path(os.path.expanduser(cfg.cache_dir)) / "hf"
            loaded = datasets.load_dataset(cfg.format, data_dir=str(root), cache_dir=str(cache))
    except (FileNotFoundError, ValueError, datasets.exceptions.DatasetNotFoundError) as e:
        raise ConfigError(f"data.root={cfg.root}: not a dataset in data.format={cfg.format}: {e}") from e
    if isinstance(loaded, datasets.Dataset):
        raise ConfigError(f"data.root={cfg.root}: one split saved, no {cfg.val_split}: save a DatasetDict with both")
    return loaded


def _split(cfg, loaded, key: str):
    split = getattr(cfg, key)
    if split not in loaded:
        raise ConfigError(f"data.{key}={split}: no such split in data.root={cfg.root} (it has {', '.join(loaded)})")
    ds = loaded[split]
    for column in (cfg.image_column, cfg.label_column):
        if column not in ds.column_names:
            which = "image_column" if column == cfg.image_column else "label_column"
            raise ConfigError(f"data.{which}={column}: split {split} has columns {', '.join(ds.column_names)}")
    return ArrowSource(ds, split, cfg.image_column, cfg.label_column)


@DATA.register("hf_images", HFImagesConfig, kind="image")
def hf_images(cfg, tokenizer=None) -> DataBundle:
    root = required_root(cfg, "a save_to_disk folder, Parquet files or an image folder, by data.format")
    loaded = _load(cfg, root)
    train, val = _split(cfg, loaded, "train_split"), _split(cfg, loaded, "val_split")
    if not (train.named or val.named):  # plain integers: classes up to the largest in either split
        train.classes = val.classes = max(train.classes, val.classes, key=len)
    return image_bundle(cfg, root.resolve().name, train, val)
