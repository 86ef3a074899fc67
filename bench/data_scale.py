"""Image data at scale: time from process start to the first training step, and the peak memory
of the main process and its 2 loader workers together, for an ImageFolder tree of small real JPEGs
(1000 classes) before this change (a git worktree of BEFORE) and after it (first start: the tree
listed; later starts: the saved listing), and for the same images as WebDataset shards and as a
Hugging Face dataset (save_to_disk); then samples/s of one epoch per format on a smaller copy.
Every arm runs `train.py` in a fresh process, arms interleaved, the page cache warm."""

from __future__ import annotations

import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import RESULTS, ROOT, hardware, interleave, labelled, train_py, write

BEFORE = "beff380"  # the last commit before the one-pass listing, the saved index and the arrays
WORK = Path(os.path.expanduser("~/.cache/turbotrain/bench/data_scale"))
COMMON = ("model=small_cnn", "data.image_size=32", "data.batch_size=64", "loader.num_workers=2", "trainer.progress_bar=false")


def make_tree(root: Path, train_files: int, classes: int = 1000) -> Path:
    """<root>/train/<class>/*.jpg (train_files in all) and one val image per class: 64 distinct
    16x16 JPEGs written over and over (what is measured is listing and reading, not decoding)."""
    if (root / "done").is_file():
        return root
    from PIL import Image

    rng = np.random.default_rng(0)
    images = []
    for _ in range(64):
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(buffer, "JPEG", quality=90)
        images.append(buffer.getvalue())
    per_class = train_files // classes
    for split, n in (("train", per_class), ("val", 1)):
        for c in range(classes):
            d = root / split / f"n{c:08d}"
            d.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                (d / f"{c:04d}_{i:05d}.jpg").write_bytes(images[(c + i) % 64])
    (root / "done").write_text("ok\n")
    return root


def make_formats(tree: Path) -> dict[str, Path]:
    """The tree as shards (1000 samples each) and as a save_to_disk dataset, made once."""
    shards, disk = tree.with_name(tree.name + "-shards"), tree.with_name(tree.name + "-disk")
    if not (shards / "classes.txt").is_file():
        from turbotrain.data.shards import convert

        convert(tree, shards, per_shard=1000)
    if not (disk / "dataset_dict.json").is_file():
        _save_dataset(tree, disk)
    return {"tree": tree, "shards": shards, "disk": disk}


def _save_dataset(tree: Path, disk: Path) -> None:
    """The tree as a save_to_disk DatasetDict (train, validation): each file's bytes in an Image
    column, its class in a ClassLabel. Written from the tree's listing, not by datasets'
    imagefolder builder, which first resolves every file's path through fsspec."""
    import datasets

    from turbotrain.data.listing import FolderSource, scan

    def rows(source: FolderSource):
        for i in range(len(source)):
            yield {"image": {"bytes": Path(source.name(i)).read_bytes(), "path": None}, "label": int(source.labels[i])}

    with tempfile.TemporaryDirectory() as hf_cache:
        splits = {}
        for split, name in (("train", "train"), ("val", "validation")):
            source = FolderSource(scan(tree / split))
            features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=source.classes)})
            splits[name] = datasets.Dataset.from_generator(
                rows, gen_kwargs={"source": source}, features=features, cache_dir=hf_cache
            )
        datasets.DatasetDict(splits).save_to_disk(str(disk))


def _tree_pids(pid: int) -> list[int]:
    pids, i = [pid], 0
    while i < len(pids):
        try:
            for task in os.listdir(f"/proc/{pids[i]}/task"):
                pids += [int(c) for c in Path(f"/proc/{pids[i]}/task/{task}/children").read_text().split()]
        except OSError:
            pass
        i += 1
    return pids


def _memory_mb(pids: list[int]) -> dict[str, float]:
    """RSS, PSS and anonymous PSS summed over the processes, MB. PSS splits shared pages among
    their sharers, so a page copied by a worker's read counts in full and a page still shared
    counts once overall; anonymous PSS leaves out file-backed pages (a memory-mapped Arrow file
    read in place, the page cache's, reclaimable), so it is the heap and its copies alone."""
    kb = {"Rss:": 0, "Pss:": 0, "Pss_Anon:": 0}
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                field = line.split()
                if field and field[0] in kb:
                    kb[field[0]] += int(field[1])
        except OSError:
            pass
    return {"peak_rss_mb": kb["Rss:"] / 1024, "peak_pss_mb": kb["Pss:"] / 1024, "peak_anon_pss_mb": kb["Pss_Anon:"] / 1024}


def start_to_first_step(cwd: Path, overrides: tuple[str, ...], env: dict | None = None) -> dict:
    """Run train.py until its first step is logged, sampling the process tree's memory on the way;
    then stop it. Seconds from the launch to the first logged step, and peak RSS and PSS."""
    with tempfile.TemporaryDirectory() as run:
        args = [sys.executable, "train.py", *COMMON, *overrides, "trainer.log_every_n_steps=1", f"hydra.run.dir={run}"]
        t0 = time.perf_counter()
        proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        peak: dict[str, float] = {}
        metrics = Path(run) / "metrics.jsonl"
        while True:
            done = metrics.is_file() and metrics.read_text().strip()
            seconds = time.perf_counter() - t0
            now = _memory_mb(_tree_pids(proc.pid))
            peak = {k: max(v, peak.get(k, 0.0)) for k, v in now.items()}
            if done:
                break
            if proc.poll() is not None:
                raise RuntimeError(f"train.py {' '.join(overrides)} failed:\n{proc.stderr.read()[-2000:]}")
            time.sleep(0.02)
        proc.kill()
        proc.wait()
    return {"first_step_s": seconds, **peak}


def _before_worktree() -> Path:
    where = WORK / f"before-{BEFORE}"
    if not where.is_dir():
        subprocess.run(["git", "worktree", "add", "--detach", str(where), BEFORE], cwd=ROOT, check=True, capture_output=True)
    return where


BUILD = """
import json, resource, sys, time
from hydra import compose, initialize_config_dir
import turbotrain.options
from turbotrain.config import register_configs
from turbotrain.data import build_data
register_configs()
with initialize_config_dir(config_dir=sys.argv[1], version_base="1.3"):
    cfg = compose("train", overrides=sys.argv[2:])
before, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
build_data(cfg.data)
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"build_s": time.perf_counter() - t0, "build_rss_mb": grown / 1024}))
"""


def build_alone(cwd: Path, overrides: tuple[str, ...], env: dict | None) -> dict:
    """build_data alone in a fresh process: its seconds and how much it raised the peak RSS."""
    args = [sys.executable, "-c", BUILD, str(cwd / "conf"), *COMMON, *overrides]
    out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _start_arms(formats: dict[str, Path], cache: Path) -> dict:
    """Each start-up arm: a call that measures one start, and the data build alone."""
    before = _before_worktree()
    env_before = {**os.environ, "PYTHONPATH": str(before / "src")}
    tree = ("data=imagenet", f"data.root={formats['tree']}", f"data.cache_dir={cache}")

    def forget_listings() -> None:
        for split in ("train", "val"):  # the tree's listings, not the shards' index
            for saved in (cache / "index").glob(f"{split}-*.npz"):
                saved.unlink()

    def arm(cwd: Path, overrides: tuple[str, ...], env: dict | None = None, first: bool = False):
        def measure() -> dict:
            if first:
                forget_listings()
            start = start_to_first_step(cwd, overrides, env)
            if first:
                forget_listings()
            return {**start, **build_alone(cwd, overrides, env)}

        return measure

    return {
        "ImageFolder before": arm(before, tree[:2], env_before),
        "ImageFolder, first start": arm(ROOT, tree, first=True),
        "ImageFolder, saved listing": arm(ROOT, tree),
        "WebDataset shards": arm(ROOT, ("data=webdataset", f"data.root={formats['shards']}", f"data.cache_dir={cache}")),
        "HF dataset": arm(ROOT, ("data=hf_images", f"data.root={formats['disk']}", f"data.cache_dir={cache}")),
    }


def _throughput(formats: dict[str, Path], cache: Path, repeats: int) -> dict:
    """samples/s of one epoch per format (steady log intervals), formats interleaved."""
    from bench.common import steady_rate

    def epoch(option: str, root: Path):
        events, _ = train_py(
            *COMMON,
            f"data={option}",
            f"data.root={root}",
            f"data.cache_dir={cache}",
            "trainer.max_epochs=1",
            "trainer.log_every_n_steps=5",
        )
        return steady_rate(events)

    arms = {"ImageFolder": ("imagenet", formats["tree"]), "WebDataset": ("webdataset", formats["shards"])}
    arms["HF dataset"] = ("hf_images", formats["disk"])
    return interleave({name: (lambda a=a: epoch(*a)) for name, a in arms.items()}, repeats)


def _starts(n: int, repeats: int, cache: Path) -> dict[str, list[dict]]:
    """Each start-up arm on a tree of n files, arms interleaved, after one unmeasured round."""
    arms = _start_arms(make_formats(make_tree(WORK / f"tree{n}", n)), cache)
    for measure in arms.values():  # warm the page cache, index the shards
        measure()
    values = {name: [] for name in arms}
    for _ in range(repeats):
        for name, measure in arms.items():
            values[name].append(measure())
    return values


def run(sizes: tuple[int, ...] = (100_000, 1_280_000), repeats: tuple[int, ...] = (3, 2), epoch_files: int = 20_000) -> Path:
    cache = WORK / "cache"
    starts = {str(n): _starts(n, r, cache) for n, r in zip(sizes, repeats, strict=True)}
    formats = make_formats(make_tree(WORK / f"tree{epoch_files}", epoch_files))
    payload = {"before": BEFORE, "starts": starts, "epoch_files": epoch_files, "epochs": _throughput(formats, cache, 3)}
    return write("data_scale", {**payload, "rows": labelled(_labels(payload), figures(payload))})


def add_size(n: int, repeats: int = 2) -> Path:
    """Measure one more tree size into the existing result file (same machine), its other rows kept."""
    payload = json.loads((RESULTS / "data_scale.json").read_text())
    if payload["hardware"] != hardware():
        raise SystemExit("bench/results/data_scale.json was measured on another machine: run the whole bench")
    payload["starts"][str(n)] = _starts(n, repeats, WORK / "cache")
    payload = {k: payload[k] for k in ("before", "starts", "epoch_files", "epochs")}
    return write("data_scale", {**payload, "rows": labelled(_labels(payload), figures(payload))})


def _labels(payload: dict) -> list[tuple[str, str]]:
    out = []
    for n in payload["starts"]:
        files = f"{int(n):,} files"
        out += [
            (f"start to first step, ImageFolder tree of {files}, 2 workers: saved listing vs before", "stat directories only"),
            (f"start to first step, ImageFolder tree of {files}, 2 workers: first start vs before", "one pass over the tree"),
            (f"start to first step, the same {files} as WebDataset shards vs ImageFolder before", "shards: no tree to list"),
            (f"start to first step, the same {files} as a Hugging Face dataset vs ImageFolder before", "Arrow, memory-mapped"),
        ]
    epoch = f"one epoch of {payload['epoch_files']:,} small JPEGs, small_cnn @32px, 2 workers"
    return [
        *out,
        (f"{epoch}: WebDataset shards vs ImageFolder", "same pipeline"),
        (f"{epoch}: HF dataset vs ImageFolder", "same pipeline"),
    ]


def _median(values: list[dict], key: str) -> float:
    return statistics.median(v[key] for v in values)


def figures(result: dict) -> list[dict]:
    rows = []
    for values in result["starts"].values():
        keys = ("first_step_s", "peak_pss_mb", "peak_anon_pss_mb", "build_s", "build_rss_mb")
        b = {k: _median(values["ImageFolder before"], k) for k in keys}
        for arm in ("ImageFolder, saved listing", "ImageFolder, first start", "WebDataset shards", "HF dataset"):
            m = {k: _median(values[arm], k) for k in b}
            ratio = b["first_step_s"] / m["first_step_s"]
            start = f"{m['first_step_s']:.1f} s vs {b['first_step_s']:.1f} s ({ratio:.2f}x)"
            memory = (
                f"peak PSS of the 3 processes {m['peak_pss_mb']:.0f} vs {b['peak_pss_mb']:.0f} MB "
                f"(anonymous: {m['peak_anon_pss_mb']:.0f} vs {b['peak_anon_pss_mb']:.0f} MB)"
            )
            build = f"{m['build_s']:.2f} s vs {b['build_s']:.2f} s, {m['build_rss_mb']:.0f} vs {b['build_rss_mb']:.0f} MB"
            rows.append({"ours": f"{start}, {memory}; the data build alone {build} more peak RSS", "ratio": ratio})
    rates = {k: v["median"] for k, v in result["epochs"].items()}
    base = rates["ImageFolder"]
    for arm in ("WebDataset", "HF dataset"):
        rows.append({"ours": f"{rates[arm]:.0f} vs {base:.0f} samples/s ({rates[arm] / base:.2f}x)", "ratio": rates[arm] / base})
    return rows


def section(results: Path) -> str:
    """The README's data-at-scale table, from the rows of the result file."""
    from bench.readme import result_table

    before = json.loads((results / "data_scale.json").read_text())["before"]
    how = f'`train.py {" ".join(COMMON)}` in a fresh process per start, arms interleaved, medians; "before" is commit {before}.'
    return result_table(results, "data_scale", how)
