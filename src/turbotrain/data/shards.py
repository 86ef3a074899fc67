"""Write WebDataset tar shards from an image folder tree (what data=webdataset reads):

    python -m turbotrain.data.shards ~/data/imagenet ~/data/imagenet-shards --per-shard 1000

Each split (train/, val/) becomes <split>-000000.tar, ... of `--per-shard` samples: `<key>.jpg`
(the file's bytes, not re-encoded; .png and others keep their extension), `<key>.cls` (the label)
and `<key>.json` ({"label", "path": the file under its split}). The training split is shuffled
before it is cut (a seeded order), so a shard holds many classes, as streaming readers expect;
classes.txt names the labels. Every shard is written atomically: a killed conversion leaves whole
shards and no partial one; running it again writes them all again."""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
from pathlib import Path

import numpy as np

from turbotrain.core.atomic import atomic_write, atomic_write_text
from turbotrain.data.listing import FolderSource, scan
from turbotrain.data.tars import CLASSES_FILE


def _member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o444  # mtime 0, no owner: the same tree gives the same bytes
    tar.addfile(info, io.BytesIO(data))


def write_shard(path: Path, source: FolderSource, indices: list[int], start: int) -> None:
    def fill(f) -> None:
        with tarfile.open(fileobj=f, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for k, i in enumerate(indices):
                name, label = source.name(i), int(source.labels[i])
                key = f"{start + k:09d}"
                ext = Path(name).suffix.lower().lstrip(".")
                _member(tar, f"{key}.{'jpg' if ext == 'jpeg' else ext}", Path(name).read_bytes())
                _member(tar, f"{key}.cls", str(label).encode())
                relative = str(Path(name).relative_to(source.root))
                _member(tar, f"{key}.json", json.dumps({"label": label, "path": relative}).encode())

    atomic_write(path, fill)


def convert(tree: Path, out: Path, per_shard: int, seed: int = 0, splits=("train", "val")) -> dict[str, int]:
    """Shards of each split of `tree` in `out`; returns the number of samples per split."""
    counts, classes = {}, None
    for split in splits:
        source = FolderSource(scan(tree / split))
        if classes is not None and source.classes != classes:
            raise SystemExit(f"error: {tree}: {split}/ has other class folders than {splits[0]}/")
        classes = source.classes
        order = np.arange(len(source))
        if split == "train":
            order = np.random.default_rng(seed).permutation(len(source))
        for s, start in enumerate(range(0, len(order), per_shard)):
            write_shard(out / f"{split}-{s:06d}.tar", source, order[start : start + per_shard].tolist(), start)
            if sys.stderr.isatty():  # a progress line on a terminal; a log gets the totals below
                print(f"{split}: {min(start + per_shard, len(order))}/{len(order)} samples", end="\r", file=sys.stderr)
        counts[split] = len(source)
    atomic_write_text(out / CLASSES_FILE, "".join(f"{c}\n" for c in classes))
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m turbotrain.data.shards", description=__doc__.split("\n\n")[0])
    parser.add_argument("tree", type=Path, help="an image folder tree: <tree>/train/<class>/*.jpg, <tree>/val/<class>/*.jpg")
    parser.add_argument("out", type=Path, help="the folder the shards are written to (data.root of data=webdataset)")
    parser.add_argument("--per-shard", type=int, default=1000, help="samples per shard (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="the training split's shuffle (default 0)")
    args = parser.parse_args(argv)
    for split in ("train", "val"):
        if not (args.tree / split).is_dir():
            parser.error(f"{args.tree}: missing {args.tree / split}/<class>/*.jpg")
    if args.per_shard < 1:
        parser.error("--per-shard must be at least 1")
    counts = convert(args.tree, args.out, args.per_shard, args.seed)
    print(f"wrote {', '.join(f'{n} {s}' for s, n in counts.items())} samples to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
