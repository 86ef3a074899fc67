"""One split of an image folder tree (<split>/<class>/**/*.jpg, torchvision ImageFolder's layout
and order) listed in one pass, into arrays, and saved.

The pass reads each directory once and stats each file once; the class digests (what a resume
checks) and the fingerprint (what names the decoded cache) come from that pass, not from passes of
their own. The listing is saved under data.cache_dir/index and reused while every directory of the
split keeps its mtime: adding, removing or renaming a file or folder changes its parent's mtime, so
a later start stats the directories only (a thousand for ImageNet, not 1.28 million files). A file
rewritten in place under the same name leaves the mtimes alone: data.index=rescan lists it again."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
from pathlib import Path

import numpy as np
import torch
from torchvision.datasets.folder import IMG_EXTENSIONS
from torchvision.io import read_file

from turbotrain.core.atomic import WriteError, atomic_write
from turbotrain.data.encoded import ImageSource

log = logging.getLogger("turbotrain")
VERSION = 1  # bump when the saved listing's layout changes


def pack_strings(strings: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Strings as one uint8 buffer and int64 offsets (n + 1): two arrays, not n Python objects."""
    data = [s.encode() for s in strings]
    offsets = np.zeros(len(data) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in data], out=offsets[1:])
    return np.frombuffer(b"".join(data), dtype=np.uint8).copy(), offsets


def unpack_string(buffer: np.ndarray, offsets: np.ndarray, i: int) -> str:
    return buffer[offsets[i] : offsets[i + 1]].tobytes().decode()


def _walk(split: str, label: int, cls: str, out: dict) -> str:
    """Every image file under split/cls (symlinks followed), in ImageFolder's order, into `out`;
    returns the class's digest of its files' names and sizes (not their folder: data.root may
    move): a resume notices class folders swapped or renamed (the same class names and counts,
    other labels), which the class names alone do not."""
    pending, found = [cls], []
    while pending:
        rel = pending.pop()
        with os.scandir(os.path.join(split, rel)) as entries:
            entries = list(entries)
        out["dirs"].append(rel)
        out["dir_mtimes"].append(os.stat(os.path.join(split, rel)).st_mtime_ns)
        files = sorted((e for e in entries if not e.is_dir() and e.name.lower().endswith(IMG_EXTENSIONS)), key=lambda e: e.name)
        stats = [(e.name, st) for e in files if (st := _stat(split, rel, e, out)) is not None]
        found.append((rel, [name for name, _ in stats], [st for _, st in stats]))
        pending += [f"{rel}/{e.name}" for e in entries if e.is_dir()]
    lines = []
    for rel, names, stats in sorted(found):
        sizes = [st.st_size for st in stats]
        out["paths"] += [f"{rel}/{name}" for name in names]
        out["sizes"] += sizes
        out["mtimes"] += [st.st_mtime_ns for st in stats]
        lines += [f"{name} {size}" for name, size in zip(names, sizes)]
    out["labels"] += [label] * (len(out["paths"]) - len(out["labels"]))
    return class_digest(lines)


def _stat(split: str, rel: str, entry: os.DirEntry, out: dict) -> os.stat_result | None:
    """The file's stat; None for one that cannot be read (a broken symlink): left out, named, counted."""
    try:
        return entry.stat()
    except OSError as e:
        log.warning("bad sample %s: %s (skipped)", os.path.join(split, rel, entry.name), e.strerror or e)
        out["left_out"] += 1
        return None


def class_digest(lines: list[str]) -> str:
    """A class's digest of its samples' "name size" lines, in any order (what a resume compares)."""
    return hashlib.sha1("\n".join(sorted(lines)).encode()).hexdigest()[:16]


def scan(split: Path) -> dict:
    """The split's listing as arrays (see FolderSource), in one pass."""
    root = str(split)
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    out = {"paths": [], "labels": [], "sizes": [], "mtimes": [], "dirs": [""], "dir_mtimes": [os.stat(root).st_mtime_ns]}
    out["left_out"] = 0
    class_files = {cls: _walk(root, label, cls, out) for label, cls in enumerate(classes)}
    meta = {"version": VERSION, "root": root, "classes": classes, "class_files": class_files, "left_out": out["left_out"]}
    paths, offsets = pack_strings(out["paths"])
    dirs, dir_offsets = pack_strings(out["dirs"])
    arrays = {
        "paths": paths,
        "offsets": offsets,
        "labels": np.asarray(out["labels"], dtype=np.int64),
        "sizes": np.asarray(out["sizes"], dtype=np.int64),
        "mtimes": np.asarray(out["mtimes"], dtype=np.int64),
        "dirs": dirs,
        "dir_offsets": dir_offsets,
        "dir_mtimes": np.asarray(out["dir_mtimes"], dtype=np.int64),
    }
    h = hashlib.sha256(f"{root}\n".encode())
    for key in ("paths", "offsets", "labels", "sizes", "mtimes"):
        h.update(arrays[key].tobytes())
    meta["fingerprint"] = h.hexdigest()[:16]
    return {"meta": np.array(json.dumps(meta)), **arrays}


def _unchanged(listing: dict, root: str) -> bool:
    """Whether every directory the listing read still has the mtime it had (and it is this split's)."""
    if json.loads(str(listing["meta"]))["root"] != root:
        return False
    dirs, offsets = listing["dirs"], listing["dir_offsets"]
    for i, mtime in enumerate(listing["dir_mtimes"].tolist()):
        try:
            if os.stat(os.path.join(root, unpack_string(dirs, offsets, i))).st_mtime_ns != mtime:
                return False
        except OSError:
            return False
    return True


def load_listing(split: Path, index_dir: Path, rescan: bool) -> dict:
    """The split's listing: the saved one while its directories are unchanged, else a new pass (saved)."""
    root = str(split.resolve())
    saved = index_dir / f"{split.name}-{hashlib.sha256(root.encode()).hexdigest()[:16]}-v{VERSION}.npz"
    if not rescan and saved.is_file():
        try:
            with np.load(saved) as f:
                listing = dict(f)
            if _unchanged(listing, root):
                return listing
        except (OSError, ValueError, KeyError) as e:  # a damaged or foreign file: list again
            log.warning("data.index: could not read %s (%s); listing %s again", saved, e, root)
    listing = scan(Path(root))
    save_index(saved, listing, f"listing of {root}")
    return listing


def save_index(path: Path, arrays: dict, what: str) -> None:
    """Save a listing or an index (npz) atomically; where it cannot be written (a read-only cache
    dir, a full disk) the run goes on and the next start lists or indexes again."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    try:
        atomic_write(path, lambda f: f.write(buffer.getbuffer()))
    except WriteError as e:
        log.warning("data.index: could not save the %s: %s", what, e)


class FolderSource(ImageSource):
    """A split's image files: paths relative to the split (one buffer), labels, sizes, mtimes (arrays)."""

    def __init__(self, listing: dict):
        meta = json.loads(str(listing["meta"]))
        self.root, self.classes, self.class_files = meta["root"], meta["classes"], meta["class_files"]
        self.fingerprint, self.left_out = meta["fingerprint"], meta.get("left_out", 0)
        self.paths, self.offsets, self.labels = listing["paths"], listing["offsets"], listing["labels"]

    def name(self, i: int) -> str:
        return os.path.join(self.root, unpack_string(self.paths, self.offsets, i))

    def encoded(self, i: int) -> torch.Tensor:
        return read_file(self.name(i))
