"""data.cache=raw|jpeg: an ImageFolder split decoded once, each image whose shorter side is longer
than the split's cache size resized down to it (never up), and stored in one file plus an index:
`raw` as uint8 pixels in height-width-channel order (memory-mapped and read in place: an image is
a view of the file, nothing to copy or decode, and a crop of it is already in the channels-last
layout torch's uint8 resize is fastest on), `jpeg` re-encoded at that size (smaller on disk,
cheap to decode).

A cache is named by the source's fingerprint of the split (data/encoded.py: for a folder tree its
paths, sizes and mtimes) and the settings, so a later run on the same tree reuses it and a changed tree or setting builds a new
one. The build runs on every core (loader workers), shows a progress bar, skips files that fail
to decode (counted and named) and is atomic: it fills a temp folder (named by host and pid) that
becomes the cache in one rename, so a killed build leaves nothing that looks valid. A cache that
exists is never replaced (other runs may have it memory-mapped): one process per job builds it
(train/distributed.py `rank_zero_first`), and of two jobs building it at once the first keeps it."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from torchvision.io import decode_jpeg, encode_jpeg
from torchvision.transforms.v2 import functional as TF
from tqdm import tqdm

from turbotrain.core.atomic import atomic_write_dir

log = logging.getLogger("turbotrain")
VERSION = 3  # bump when the stored format changes (2: images are never enlarged; 3: raw is HWC)
DATA_FILE, INDEX_FILE = "images.bin", "index.json"


def fingerprint(source, kind: str, size: int) -> str:
    return hashlib.sha256(f"v{VERSION} {kind} {size} {source.fingerprint}".encode()).hexdigest()[:16]


class _Decode(Dataset):
    """One image -> its stored bytes (uint8, HWC raw pixels or JPEG) and CHW shape, or the error that stopped it."""

    def __init__(self, source, read, kind: str, size: int):
        self.source, self.read, self.kind, self.size = source, read, kind, size

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int):
        try:
            image = self.read(self.source.encoded(i)).as_subclass(torch.Tensor)
            if min(image.shape[-2:]) > self.size:  # enlarging would only add bytes
                image = TF.resize(image, self.size, antialias=True)
        except Exception as e:  # a bad file is skipped and named, as in training
            return i, None, None, f"{type(e).__name__}: {e}"
        data = image.permute(1, 2, 0).contiguous() if self.kind == "raw" else encode_jpeg(image, quality=90)
        return i, data.flatten(), tuple(image.shape), None


def build(folder: Path, source, read, kind: str, size: int) -> None:
    """Decode, resize and store every image of `source` (data/encoded.py) into `folder` (atomically)."""

    def fill(tmp: Path) -> None:
        t0, offsets, shapes, labels, bad, offset = time.perf_counter(), [], [], [], [], 0
        loader = DataLoader(
            _Decode(source, read, kind, size),
            batch_size=None,
            num_workers=os.cpu_count() or 1,
            prefetch_factor=8,
            generator=torch.Generator(),  # the workers' seed; without one it is drawn from the global RNG
        )
        bar = tqdm(loader, total=len(source), desc=f"data.cache={kind}: decoding", leave=False, disable=None)  # None: a tty only
        with open(tmp / DATA_FILE, "wb") as f:
            for i, data, shape, error in bar:
                if error is not None:
                    bad.append(f"{source.name(i)} ({error})")
                    continue
                f.write(data.numpy().tobytes())
                offsets.append(offset)
                shapes.append(shape)
                labels.append(int(source.labels[i]))
                offset += data.numel()
        seconds = time.perf_counter() - t0
        stats = {"images": len(labels), "bad": bad, "seconds": seconds, "bytes": offset}
        index = {"version": VERSION, "kind": kind, "size": size, "offsets": offsets, "shapes": shapes, "labels": labels, **stats}
        (tmp / INDEX_FILE).write_text(json.dumps(index))
        if bad:
            log.warning("data.cache: skipped %d file(s) that failed to decode, e.g. %s", len(bad), "; ".join(bad[:3]))
        log.info(
            "data.cache=%s: %d images in %.1f s (%.0f images/s), %.0f bytes per image -> %s",
            *(kind, len(labels), seconds, len(labels) / max(seconds, 1e-9), offset / max(len(labels), 1), folder),
        )

    if not atomic_write_dir(folder, fill, replace=False):
        log.info("data.cache: another process finished %s first; this one reads it", folder)


class CachedImages(Dataset):
    """The images of a cache as uint8 CHW tensors (`load(i)`), with their labels. Raw images are
    views of the read-only mapping (channels-last strides): a stray in-place write faults at once
    instead of silently changing the image for every later epoch."""

    def __init__(self, folder: Path):
        index = json.loads((folder / INDEX_FILE).read_text())
        self.kind, self.offsets, self.shapes = index["kind"], index["offsets"], [tuple(s) for s in index["shapes"]]
        self.labels = torch.tensor(index["labels"], dtype=torch.long)
        self.sizes = np.diff([*self.offsets, index["bytes"]]).tolist()
        self.data = torch.zeros(0, dtype=torch.uint8)
        if index["bytes"]:
            with warnings.catch_warnings():  # torch warns that the mapping is read-only: it is meant to be
                warnings.simplefilter("ignore", UserWarning)
                self.data = torch.from_numpy(np.memmap(folder / DATA_FILE, dtype=np.uint8, mode="r"))

    def __len__(self) -> int:
        return len(self.labels)

    def _bytes(self, i: int) -> torch.Tensor:
        start = self.offsets[i]
        return self.data[start : start + self.sizes[i]]

    def _pixels(self, i: int) -> torch.Tensor:
        c, h, w = self.shapes[i]
        return self._bytes(i).view(h, w, c).permute(2, 0, 1)

    def load(self, indices: list[int]) -> list[torch.Tensor]:
        if self.kind == "raw":
            return [self._pixels(i) for i in indices]
        return decode_jpeg([self._bytes(i) for i in indices])  # one call for the batch

    def __getitem__(self, i: int):
        return self.load([i])[0], int(self.labels[i])


def open_cache(cache_root: Path, name: str, source, read, kind: str, size: int) -> CachedImages:
    """The cache of `source`'s images under `cache_root`, built first when there is none for them."""
    folder = cache_root / f"{name}-{kind}{size}-{fingerprint(source, kind, size)}"
    if not (folder / INDEX_FILE).is_file():
        _name_older(cache_root, name, folder)
        build(folder, source, read, kind, size)
    return CachedImages(folder)


def _name_older(cache_root: Path, name: str, new: Path) -> None:
    """A changed tree, setting or format leaves the split's earlier caches in place (another run
    may still read them); an ImageNet-sized one holds tens of GB, so say where they are."""
    older = [p for p in sorted(cache_root.glob(f"{name}-*")) if p != new and (p / INDEX_FILE).is_file()]
    if older:
        gb = sum(f.stat().st_size for p in older for f in p.iterdir()) / 1e9
        log.warning(
            "data.cache: building a new cache of %s; %d earlier one(s) of it (%.2f GB) are kept, "
            "delete them if no run reads them: %s",
            *(name, len(older), gb, " ".join(map(str, older))),
        )
