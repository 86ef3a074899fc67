"""data=webdataset: WebDataset tar shards (`train-{000000..001023}.tar`, each sample `<key>.jpg`
(or .jpeg/.png/.webp) and `<key>.cls`, the label as text, or `<key>.json` with a "label"), read by
random access: each shard's members are indexed once with the standard library's tarfile (headers
only, plus the label members), the index saved under data.cache_dir/index, and an image is one
pread at its offset. So the epoch order, the split across ranks and workers (no sample twice in an
epoch), the seeded augmentation and the exact mid-epoch resume are the image folder's, and a
thousand shards are a thousand files to open, not a million.

Shards must be plain (uncompressed) tars on a local or mounted filesystem (NFS, Lustre, an object
store mounted with mountpoint-s3 or gcsfuse): random access cannot go through a pipe or an HTTP
stream. `python -m turbotrain.data.shards` writes them from an image folder tree."""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from braceexpand import braceexpand

from turbotrain.core.schema import ConfigError
from turbotrain.data.bundle import DATA, DataBundle
from turbotrain.data.encoded import ImageSource, image_bundle
from turbotrain.data.folder import EncodedImagesConfig, required_root
from turbotrain.data.listing import class_digest, pack_strings, save_index, unpack_string
from turbotrain.data.safe import DataError

log = logging.getLogger("turbotrain")
VERSION = 3  # bump when the saved index's layout or meaning changes (3: one record per sample)
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
CLASSES_FILE = "classes.txt"  # beside the shards: one class name per line, label order
OPEN_FILES = 128  # shards a process keeps open at once


@dataclass
class ShardsConfig(EncodedImagesConfig):
    # relative to data.root (or absolute); {a..b} ranges and * globs
    train_shards: str = "train-*.tar"
    val_shards: str = "val-*.tar"  # validation shards: a brace pattern or glob under data.root


def shard_paths(cfg, root: Path, key: str) -> list[Path]:
    """The shards a pattern names, in its order; a missing shard or an empty glob is one line naming it."""
    pattern = getattr(cfg, key)
    if re.match(r"^[a-z][a-z0-9+]*:", pattern):
        raise ConfigError(
            f"data.{key}={pattern}: shards are read by random access, from a local or mounted filesystem, "
            "not a URL: mount the bucket (mountpoint-s3, gcsfuse) or copy the shards, and give their path"
        )
    paths = []
    for name in braceexpand(os.path.expanduser(pattern)):
        full = root / name
        if glob.has_magic(name):
            matched = sorted(glob.glob(str(full)))
            if not matched:
                raise ConfigError(f"data.{key}={pattern}: no shard matches {full}")
            paths += [Path(p) for p in matched]
        elif not full.is_file():
            raise ConfigError(f"data.{key}={pattern}: missing shard {full}")
        else:
            paths.append(full)
    return paths


class BadSample(ValueError):
    """One sample of a shard that cannot train: it alone is left out (or stops the run), named."""


def _label(member_bytes: bytes, ext: str) -> int:
    """The label a .cls (an integer as text) or a .json ({"label": n} or {"cls": n}) holds."""
    try:
        if ext == "cls":
            return int(member_bytes.decode().strip())
        meta = json.loads(member_bytes)
        value = meta["label"] if "label" in meta else meta["cls"]
    except (ValueError, UnicodeDecodeError, KeyError, TypeError) as e:  # a WordNet id, no "label" key, a list...
        raise BadSample(f"its .{ext} holds no integer label ({type(e).__name__}: {e})") from e
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).strip().isdigit():
        raise BadSample(f"its .{ext} label {value!r} is not a non-negative integer")
    return int(value)


def _samples_of(tar: tarfile.TarFile):
    """(key, {ext: member}) per sample: consecutive members sharing a key (WebDataset's grouping:
    the key is the member's path up to the first dot of its name)."""
    key, group = None, {}
    for member in tar:
        if not member.isfile():
            continue
        directory, base = os.path.split(member.name)
        stem, dot, ext = base.partition(".")
        if not dot:
            continue
        name = os.path.join(directory, stem)
        if name != key and group:
            yield key, group
            group = {}
        key, group[ext.lower()] = name, member
    if group:
        yield key, group


def _sample(tar: tarfile.TarFile, group: dict) -> tuple[int, int, int]:
    """(offset, size, label) of one sample; BadSample says why not. A sample the shard ends
    inside never gets here: tarfile fails reading the header after it, before _samples_of yields it."""
    image = next((group[e] for e in IMAGE_EXTS if e in group), None)
    label = next((e for e in ("cls", "json") if e in group), None)
    if image is None or label is None:
        what = "image member (.jpg, .jpeg, .png, .webp)" if image is None else "label member (.cls, .json)"
        raise BadSample(f"no {what}; it has {', '.join('.' + e for e in group)}")
    if image.size == 0:
        raise BadSample("its image member is empty")
    return image.offset_data, image.size, _label(tar.extractfile(group[label]).read(), label)


COMPRESSED = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00", b"\x28\xb5\x2f\xfd")  # gzip, bzip2, xz, zstd


def _check_plain(path: Path) -> None:
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic.startswith(COMPRESSED):
        raise ConfigError(
            f"shard {path} is compressed: shards are read by random access, which needs plain tars; "
            "decompress them (gunzip, bunzip2, unxz) or write them uncompressed"
        )


def index_shard(path: Path, policy: str) -> tuple[list[str], list[int], list[int], list[int], int]:
    """(keys, offsets, sizes, labels, skipped) of one shard's samples, one record per sample: a
    malformed sample is left out alone and named (data.on_bad_sample=skip) or stops the run naming
    it (error). Damage that ends the tar keeps the samples before it and counts one lost sample:
    how many followed cannot be known."""
    _check_plain(path)
    records, skipped, shard_size = [], 0, path.stat().st_size

    def report(message: str, if_error: str, if_skipped: str, lost: int) -> None:
        """One policy for every kind of loss: stop naming it, or warn and count what it cost."""
        nonlocal skipped
        if policy == "error":
            raise DataError(f"{message} (data.on_bad_sample=skip {if_error})")
        log.warning("%s (%s)", message, if_skipped)
        skipped += lost

    try:
        with tarfile.open(path, "r:") as tar:
            for key, group in _samples_of(tar):
                try:
                    records.append((key, *_sample(tar, group)))
                except BadSample as e:
                    report(f"bad sample {path}:{key}: {e}", "leaves it out", "skipped", 1)
            if 0 < shard_size - tar.offset < tarfile.BLOCKSIZE:  # tarfile stops at a header cut short, silently
                # the sample the cut fell in is counted where its members show it; later ones cannot be
                message = f"shard {path} ends inside a member's header after {len(records)} samples (truncated)"
                report(message, "keeps the samples before it", "any later samples are lost", 0)
    except (tarfile.TarError, OSError) as e:  # tarfile's "unexpected end of data": cut inside a member
        message = f"shard {path} is damaged after {len(records)} samples: {type(e).__name__}: {e}"
        how_many = "counted as one lost sample: how many followed it cannot be known"
        report(message, "keeps the samples before the damage", how_many, 1)
    keys, offsets, sizes, labels = (list(column) for column in zip(*records, strict=True)) if records else ([], [], [], [])
    return keys, offsets, sizes, labels, skipped


def _index(paths: list[Path], policy: str) -> dict:
    out = {"keys": [], "shard": [], "offsets": [], "sizes": [], "labels": []}
    skipped = 0
    for s, path in enumerate(paths):
        keys, offsets, sizes, labels, bad = index_shard(path, policy)
        out["keys"] += keys
        out["shard"] += [s] * len(keys)
        out["offsets"] += offsets
        out["sizes"] += sizes
        out["labels"] += labels
        skipped += bad
    keys, key_offsets = pack_strings(out["keys"])
    arrays = {k: np.asarray(out[k], dtype=np.int64) for k in ("shard", "offsets", "sizes", "labels")}
    digests = json.dumps(_label_files(out["keys"], out["sizes"], out["labels"]))
    return {"keys": keys, "key_offsets": key_offsets, **arrays, "skipped": np.array(skipped), "label_files": np.array(digests)}


def _label_files(keys: list[str], sizes: list[int], labels: list[int]) -> dict[str, str]:
    """Per label, a digest of its samples' keys and image sizes (an image folder's class digest)."""
    names: dict[int, list[str]] = {}
    for key, size, label in zip(keys, sizes, labels):
        names.setdefault(label, []).append(f"{key} {size}")
    return {str(k): class_digest(v) for k, v in names.items()}


def load_index(paths: list[Path], index_dir: Path, policy: str) -> dict:
    """The shards' index: the saved one for these shards (paths, sizes, mtimes), else built and saved."""
    stats = "\n".join(f"{p.resolve()} {(st := p.stat()).st_size} {st.st_mtime_ns}" for p in paths)
    digest = hashlib.sha256(f"v{VERSION}\n{stats}".encode()).hexdigest()[:16]
    saved = index_dir / f"shards-{digest}.npz"
    if saved.is_file():
        with np.load(saved) as f:
            return {**dict(f), "digest": digest}
    index = _index(paths, policy)
    save_index(saved, index, f"index of {len(paths)} shards")
    return {**index, "digest": digest}


class ShardSource(ImageSource):
    """One split's samples across its shards: shard number, image offset and size, label (arrays)."""

    def __init__(self, paths: list[Path], index: dict, classes: list[str]):
        self.paths, self.classes = [str(p) for p in paths], classes
        self.keys, self.key_offsets = index["keys"], index["key_offsets"]
        self.shard, self.offsets, self.sizes, self.labels = index["shard"], index["offsets"], index["sizes"], index["labels"]
        self.fingerprint, self.left_out = str(index["digest"]), int(index["skipped"])
        digests = json.loads(str(index["label_files"]))
        self.class_files = {c: digests.get(str(k), "") for k, c in enumerate(classes)}
        self._open: dict[int, int] = {}

    def __getstate__(self) -> dict:  # a spawned worker opens its own files
        return {**self.__dict__, "_open": {}}

    def name(self, i: int) -> str:
        return f"{self.paths[self.shard[i]]}:{unpack_string(self.keys, self.key_offsets, i)}"

    def encoded(self, i: int) -> torch.Tensor:
        s = int(self.shard[i])
        if s not in self._open:
            if len(self._open) >= OPEN_FILES:
                for fd in self._open.values():
                    os.close(fd)
                self._open.clear()
            self._open[s] = os.open(self.paths[s], os.O_RDONLY)
        data = os.pread(self._open[s], int(self.sizes[i]), int(self.offsets[i]))
        if len(data) < self.sizes[i]:
            raise OSError(f"the shard ends {self.sizes[i] - len(data)} bytes into this member (truncated?)")
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _classes(cfg, train_paths: list[Path], labels: list[np.ndarray]) -> list[str]:
    """classes.txt beside the training shards, or the label numbers as names."""
    listed = train_paths[0].parent / CLASSES_FILE
    top = max((int(a.max()) for a in labels if len(a)), default=-1)
    if not listed.is_file():
        return [str(k) for k in range(top + 1)]
    classes = [line for line in listed.read_text().splitlines() if line]
    if top >= len(classes):
        raise ConfigError(f"data.root={cfg.root}: label {top} in the shards, but {listed} names {len(classes)} classes")
    return classes


@DATA.register("webdataset", ShardsConfig, kind="image")
def webdataset(cfg, tokenizer=None) -> DataBundle:
    root = required_root(cfg, "a dir of WebDataset tar shards: train-*.tar, val-*.tar")
    index_dir = Path(os.path.expanduser(cfg.cache_dir)) / "index"
    paths = {split: shard_paths(cfg, root, f"{split}_shards") for split in ("train", "val")}
    indexes = {split: load_index(p, index_dir, cfg.on_bad_sample) for split, p in paths.items()}
    classes = _classes(cfg, paths["train"], [ix["labels"] for ix in indexes.values()])
    train, val = (ShardSource(paths[s], indexes[s], classes) for s in ("train", "val"))
    if skipped := train.left_out + val.left_out:
        log.warning("data=webdataset: %d malformed or damaged sample(s) left out of the index (bad_samples_indexed)", skipped)
    return image_bundle(cfg, root.resolve().name, train, val)
