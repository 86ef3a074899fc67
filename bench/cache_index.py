"""The decoded cache's index at ImageNet size (1,281,167 images): seconds to open it, how much it
raises the opening process's peak RSS, and how much private memory one loader worker (forked
after the open, as DataLoader's are) gains from one pass over every image's index entry, which
is what a worker does in an epoch. Before: the index as JSON lists (commit BEFORE's
data/cache.py, run as it was); after: one memory-mapped array of fixed-size records (this tree's).
The pixels are not read: the data file is a small stand-in, the index entries are real-sized
(offsets of a ~60 GB JPEG cache, 448-800 px sides, 1000 classes). Each open runs in a fresh
process, arms interleaved, medians."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.common import ROOT, labelled, write

BEFORE = "43f5bd5"  # the last commit with index.json's per-image lists
N = 1_281_167

PROBE = """
import importlib.util, json, os, pathlib, resource, sys, time

spec = importlib.util.spec_from_file_location("cache_under_test", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
before, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
cache = module.CachedImages(pathlib.Path(sys.argv[2]))
open_s, grown = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before

def private_kb():
    for line in pathlib.Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("Private_Dirty:"):
            return int(line.split()[1])

r, w = os.pipe()
if os.fork() == 0:  # a loader worker: one pass over every entry, as an epoch makes
    start = private_kb()
    for i in range(len(cache)):
        cache._bytes(i)
    os.write(w, str(private_kb() - start).encode())
    os._exit(0)
os.wait()
worker_kb = int(os.read(r, 64))
print(json.dumps({"open_s": open_s, "open_rss_mb": grown / 1024, "worker_private_mb": worker_kb / 1024, "images": len(cache)}))
"""


def _entries(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    sides = rng.integers(448, 800, (n, 2))
    sizes = rng.integers(30_000, 120_000, n)
    return {
        "sides": sides,
        "sizes": sizes,
        "offsets": np.cumsum(sizes) - sizes,
        "labels": np.repeat(np.arange(1000), -(-n // 1000))[:n],
    }


def _before_cache(folder: Path, e: dict[str, np.ndarray]) -> Path:
    shapes = [[3, int(h), int(w)] for h, w in e["sides"]]
    index = {"version": 3, "kind": "jpeg", "size": 448, "offsets": e["offsets"].tolist(), "shapes": shapes}
    index |= {"labels": e["labels"].tolist(), "images": len(shapes), "bad": [], "seconds": 0.0, "bytes": int(e["sizes"].sum())}
    (folder / "index.json").write_text(json.dumps(index))
    code = subprocess.run(["git", "show", f"{BEFORE}:src/turbotrain/data/cache.py"], cwd=ROOT, capture_output=True, text=True)
    (folder / "cache_before.py").write_text(code.stdout)
    return folder / "cache_before.py"


def _after_cache(folder: Path, e: dict[str, np.ndarray]) -> Path:
    from turbotrain.data import cache

    records = np.zeros(len(e["sizes"]), cache.RECORD)
    records["offset"], records["size"], records["label"] = e["offsets"], e["sizes"], e["labels"]
    records["shape"] = np.column_stack([np.full(len(records), 3), e["sides"]])
    cache.save_index(folder, records, "jpeg", 448, bad=[], seconds=0.0)
    return Path(cache.__file__)


def _open(code: Path, folder: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(code), str(folder)], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(n: int = N, repeats: int = 3) -> Path:
    e = _entries(n)
    with tempfile.TemporaryDirectory() as tmp:
        arms = {}
        for name, make in (("before", _before_cache), ("after", _after_cache)):
            folder = Path(tmp) / name
            folder.mkdir()
            (folder / "images.bin").write_bytes(b"\0" * 4096)  # the pixels are not what is measured
            arms[name] = (make(folder, e), folder)
        values: dict[str, list[dict]] = {name: [] for name in arms}
        for _ in range(repeats):
            for name, (code, folder) in arms.items():
                values[name].append(_open(code, folder))
    payload = {"before": BEFORE, "images": n, "repeats": values}
    return write("cache_index", {**payload, "rows": labelled(_labels(payload), figures(payload))})


def _labels(payload: dict) -> list[tuple[str, str]]:
    return [(f"decoded cache index of {payload['images']:,} images: memory-mapped records vs JSON lists", "no object per image")]


def figures(result: dict) -> list[dict]:
    m = {arm: {k: statistics.median(v[k] for v in runs) for k in runs[0]} for arm, runs in result["repeats"].items()}
    a, b = m["after"], m["before"]
    ratio = b["open_s"] / a["open_s"]
    text = (
        f"open {a['open_s']:.3f} s vs {b['open_s']:.1f} s ({ratio:.0f}x), {a['open_rss_mb']:.0f} vs {b['open_rss_mb']:.0f} MB "
        f"more peak RSS; one worker's pass over the index {a['worker_private_mb']:.0f} vs {b['worker_private_mb']:.0f} MB private"
    )
    return [{"ours": text, "ratio": ratio}]
