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

from turbotrain.core.atomic import atomic_write
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


def _walk(split: str, label: int, cls: str, out: dict) -> None:
    """Every image file under split/cls (symlinks followed), in ImageFolder's order."""
    pending, found = [cls], []
    while pending:
        rel = pending.pop()
        with os.scandir(os.path.join(split, rel)) as entries:
            entries = list(entries)
        out["dirs"].append(rel)
        out["dir_mtimes"].append(os.stat(os.path.join(split, rel)).st_mtime_ns)
        files = sorted((e for e in entries if not e.is_dir() and e.name.lower().endswith(IMG_EXTENSIONS)), key=lambda e: e.name)
        found.append((rel, [(e.name, e.stat()) for e in files]))
        pending += [os.path.join(rel, e.name) for e in entries if e.is_dir()]
    for rel, files in sorted(found):
        for f, st in files:
            out["paths"].append(os.path.join(rel, f))
            out["labels"].append(label)
            out["sizes"].append(st.st_size)
            out["mtimes"].append(st.st_mtime_ns)


def _class_files(out: dict, classes: list[str]) -> dict[str, str]:
    """Per class, a digest of its training files' names and sizes (not their folder: data.root may
    move): a resume notices class folders swapped or renamed (the same class names and counts,
    other labels), which the class names alone do not."""
    names: dict[str, list[str]] = {c: [] for c in classes}
    for path, label, size in zip(out["paths"], out["labels"], out["sizes"]):
        names[classes[label]].append(f"{os.path.basename(path)} {size}")
    return {c: hashlib.sha1("\n".join(sorted(files)).encode()).hexdigest()[:16] for c, files in names.items()}


def scan(split: Path) -> dict:
    """The split's listing as arrays (see FolderSource), in one pass."""
    root = str(split)
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    out = {"paths": [], "labels": [], "sizes": [], "mtimes": [], "dirs": [""], "dir_mtimes": [os.stat(root).st_mtime_ns]}
    for label, cls in enumerate(classes):
        _walk(root, label, cls, out)
    meta = {"version": VERSION, "root": root, "classes": classes, "class_files": _class_files(out, classes)}
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
    buffer = io.BytesIO()
    np.savez(buffer, **listing)
    try:
        atomic_write(saved, lambda f: f.write(buffer.getbuffer()))
    except OSError as e:  # a read-only cache dir: the run goes on, the next start lists again
        log.warning("data.index: could not save the listing of %s (%s)", root, e)
    return listing


class FolderSource(ImageSource):
    """A split's image files: paths relative to the split (one buffer), labels, sizes, mtimes (arrays)."""

    def __init__(self, listing: dict):
        meta = json.loads(str(listing["meta"]))
        self.root, self.classes, self.class_files = meta["root"], meta["classes"], meta["class_files"]
        self.fingerprint = meta["fingerprint"]
        self.paths, self.offsets, self.labels = listing["paths"], listing["offsets"], listing["labels"]

    def name(self, i: int) -> str:
        return os.path.join(self.root, unpack_string(self.paths, self.offsets, i))

    def encoded(self, i: int) -> torch.Tensor:
        return read_file(self.name(i))
