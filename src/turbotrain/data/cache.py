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
VERSION = 4  # bump when the stored format changes (2: images are never enlarged; 3: raw is HWC; 4: index.npy)
DATA_FILE, RECORDS_FILE, INDEX_FILE = "images.bin", "index.npy", "index.json"  # index.json last: the build's summary
# One fixed-size record per stored image, memory-mapped at open: no Python object per image, so an
# ImageNet-sized index opens at once and its pages stay shared by every rank and loader worker.
RECORD = np.dtype([("offset", "<i8"), ("size", "<i8"), ("shape", "<i4", (3,)), ("label", "<i8")])


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
        t0, records, bad, offset, kept = time.perf_counter(), np.zeros(len(source), RECORD), [], 0, 0
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
                records[kept] = (offset, data.numel(), shape, int(source.labels[i]))  # the image and its label, together
                offset, kept = offset + data.numel(), kept + 1
        seconds = time.perf_counter() - t0
        save_index(tmp, records[:kept], kind, size, bad=bad, seconds=seconds)
        if bad:
            log.warning("data.cache: skipped %d file(s) that failed to decode, e.g. %s", len(bad), "; ".join(bad[:3]))
        log.info(
            "data.cache=%s: %d images in %.1f s (%.0f images/s), %.0f bytes per image -> %s",
            *(kind, kept, seconds, kept / max(seconds, 1e-9), offset / max(kept, 1), folder),
        )

    if not atomic_write_dir(folder, fill, replace=False):
        log.info("data.cache: another process finished %s first; this one reads it", folder)


def save_index(folder: Path, records: np.ndarray, kind: str, size: int, bad: list[str], seconds: float) -> None:
    """The cache's index: `records` (RECORD, one per stored image) and the build's summary."""
    np.save(folder / RECORDS_FILE, records)
    nbytes = int(records["offset"][-1] + records["size"][-1]) if len(records) else 0
    summary = {"version": VERSION, "kind": kind, "size": size, "images": len(records), "bad": bad, "seconds": seconds}
    (folder / INDEX_FILE).write_text(json.dumps({**summary, "bytes": nbytes}))


class CachedImages(Dataset):
    """The images of a cache as uint8 CHW tensors (`load(i)`), with their labels. Raw images are
    views of the read-only mapping (channels-last strides): a stray in-place write faults at once
    instead of silently changing the image for every later epoch."""

    def __init__(self, folder: Path):
        index = json.loads((folder / INDEX_FILE).read_text())
        self.kind, self.bad = index["kind"], index["bad"]  # the files that failed to decode in the build, named
        self.records = np.load(folder / RECORDS_FILE, mmap_mode="r")
        self.labels = torch.from_numpy(np.ascontiguousarray(self.records["label"]))
        self.data = torch.zeros(0, dtype=torch.uint8)
        if index["bytes"]:
            with warnings.catch_warnings():  # torch warns that the mapping is read-only: it is meant to be
                warnings.simplefilter("ignore", UserWarning)
                self.data = torch.from_numpy(np.memmap(folder / DATA_FILE, dtype=np.uint8, mode="r"))

    @property
    def shapes(self) -> np.ndarray:
        """(C, H, W) of every stored image, one row each."""
        return self.records["shape"]

    def __len__(self) -> int:
        return len(self.labels)

    def _bytes(self, i: int) -> torch.Tensor:
        start = int(self.records["offset"][i])
        return self.data[start : start + int(self.records["size"][i])]

    def _pixels(self, i: int) -> torch.Tensor:
        c, h, w = (int(n) for n in self.records["shape"][i])
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
