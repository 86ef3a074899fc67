"""The decoded caches (data.cache=raw|jpeg) against per-sample decoding, on the loader bench's JPEG
tree: training throughput and data wait through `python train.py` (0 workers), top-1 of the
batched crops against per-sample crops, and the input pipeline alone on one core."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from bench.common import ROOT, interleave, labelled, train_py, write
from bench.loader import _measure, figures, jpeg_tree, on_tree, short_epoch


def _pipelines(root: Path, size: int, batch: int) -> dict:
    """name -> a function returning one training batch (normalized float), without a model."""
    from PIL import Image
    from torchvision import transforms as v1
    from torchvision.datasets import ImageFolder

    import turbotrain.options  # noqa: F401  (fills the option registries)
    from turbotrain.config import register_configs
    from turbotrain.data import build_data
    from turbotrain.data.vision import NormalizeCollate

    register_configs()
    from hydra import compose, initialize_config_dir

    def data_of(*overrides):
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            cfg = compose("train", overrides=["data=imagenet", f"data.root={root}", f"data.image_size={size}", *overrides])
        return build_data(cfg.data)

    references = v1.Compose(  # torchvision's classification references: PIL decode, per-sample transforms
        [v1.RandomResizedCrop(size), v1.RandomHorizontalFlip(), v1.PILToTensor(), v1.ConvertImageDtype(torch.float)]
    )
    pil = ImageFolder(str(root / "train"), transform=references, loader=lambda p: Image.open(p).convert("RGB"))
    ours, raw, jpeg = data_of(), data_of("data.cache=raw"), data_of("data.cache=jpeg")
    norm = NormalizeCollate([0.5] * 3, [0.25] * 3)
    n = len(pil)
    picks = {}

    def indices(name: str) -> list[int]:
        start = picks.get(name, 0)
        picks[name] = (start + batch) % (n - batch)
        return list(range(start, start + batch))

    return {
        "per-sample PIL (torchvision references)": lambda: torch.stack([pil[i][0] for i in indices("pil")]),
        "per-sample torchvision.io (data.cache=none)": lambda: ours.collate([ours.train[i] for i in indices("io")]),
        "cached raw, batched": lambda: norm(raw.train.__getitems__(indices("raw"))),
        "cached jpeg, batched": lambda: norm(jpeg.train.__getitems__(indices("jpeg"))),
    }


def pipeline_alone(repeats: int = 5, batches: int = 8, size: int = 64, batch: int = 64) -> Path:
    """Samples/s of each input pipeline on one core, no model: what one core of a GPU host feeds."""
    from turbotrain.core.allocator import configure_malloc

    root = jpeg_tree()
    torch.set_num_threads(1)
    configure_malloc("retain")  # as a training process has it (trainer.malloc's default)
    pipelines = _pipelines(root, size, batch)
    for fn in pipelines.values():  # warm-up (and the caches' one-time build, outside the timing)
        fn()

    def rate(fn):
        def timed() -> float:
            t0 = time.perf_counter()
            for _ in range(batches):
                fn()
            return batches * batch / (time.perf_counter() - t0)

        return timed

    results = interleave({name: rate(fn) for name, fn in pipelines.items()}, repeats)
    payload = {"size": size, "batch": batch, "results": results}
    labels = [
        (
            f"input pipeline alone, one core, JPEG tree (224 px) -> {size} px batches of {batch}: {name} vs per-sample io",
            "-",
        )
        for name in list(results)
        if name != BASE_PIPELINE
    ]
    return write("loader_pipeline", {**payload, "rows": labelled(labels, pipeline_figures(payload))})


BASE_PIPELINE = "per-sample torchvision.io (data.cache=none)"


def pipeline_figures(result: dict) -> list[dict]:
    """Per-core samples/s of each pipeline against ours per sample, and what 16 such cores feed."""
    med = {name: r["median"] for name, r in result["results"].items()}
    base = med[BASE_PIPELINE]
    return [
        {
            "ours": f"{rate:.0f} vs {base:.0f} samples/s per core ({rate / base:.2f}x); 16 cores: {16 * rate:.0f} samples/s",
            "ratio": rate / base,
        }
        for name, rate in med.items()
        if name != BASE_PIPELINE
    ]


def cached(repeats: int = 5, batches: int = 100, size: int = 64, batch: int = 64) -> Path:
    """resnet18 on the JPEG tree, 0 workers: the decoded caches (batched crops) against today's
    default loader (per-sample decode)."""
    root = jpeg_tree()
    common = (*on_tree(root, size, batch), *short_epoch(batches))
    arms = {"default": ("loader=default",), "cache=raw": ("data.cache=raw",), "cache=jpeg": ("data.cache=jpeg",)}
    for overrides in arms.values():  # the caches are built once, before anything is timed
        train_py(*common, *overrides, "trainer.limit_train_batches=1")
    results = _measure(arms, common, repeats)
    labels = [
        (
            f"resnet18 @{size}px on real JPEGs (224 px), batch {batch}, 0 workers: data.{a} vs per-sample decode",
            "data wait <= 3 %",
        )
        for a in ("cache=raw", "cache=jpeg")
    ]
    return write(
        "loader_cached", {"tree": str(root), "results": results, "rows": labelled(labels, figures({"results": results}))}
    )


def cached_accuracy(
    seeds: tuple[int, ...] = (0, 1, 2), epochs: int = 5, size: int = 64, batch: int = 64, cache_size: int | None = None
) -> Path:
    """Top-1 of resnet18 on the JPEG tree: per-sample decode and crops vs the raw cache's batched
    crops (the same draws and the same resize: what differs is the cache's resolution, the
    default's or `cache_size`'s; at the files' own size, nothing)."""
    root = jpeg_tree()
    common = (*on_tree(root, size, batch), f"trainer.max_epochs={epochs}")
    sized = (f"data.cache_size={cache_size}",) if cache_size else ()
    arms = {"per sample": ("loader.batched=false",), "cache=raw, batched": ("data.cache=raw", *sized)}
    results = top1_per_seed(arms, seeds, common)
    stored = f"stored at {cache_size} px" if cache_size else "stored at the default size"
    label = (
        f"resnet18 @{size}px on real JPEGs, {epochs} epochs, seeds {list(seeds)}: "
        f"top-1 of the cached batched path ({stored}) vs per sample"
    )
    rows = labelled([(label, "top-1 within noise")], accuracy_figures({"results": results}))
    name = f"loader_cached_accuracy_{cache_size}px" if cache_size else "loader_cached_accuracy"
    return write(name, {"tree": str(root), "cache_size": cache_size, "results": results, "rows": rows})


def top1_per_seed(arms: dict, seeds: tuple[int, ...], common: tuple[str, ...] = ()) -> dict[str, list[float]]:
    """arm -> best top-1 of a whole `python train.py` run with the arm's overrides, per seed."""
    return {name: [train_py(*common, *o, f"trainer.seed={s}")[1]["best_val_acc1"] for s in seeds] for name, o in arms.items()}


def accuracy_figures(result: dict) -> list[dict]:
    """The mean difference, per seed, and each arm's spread over seeds (what "noise" is here)."""
    (base, base_acc), (name, acc) = result["results"].items()
    mean = {k: statistics.mean(v) for k, v in result["results"].items()}
    spread = {k: 100 * (max(v) - min(v)) for k, v in result["results"].items()}
    return [
        {
            "ours": f"mean top-1 {mean[name]:.4f} vs {mean[base]:.4f} ({100 * (mean[name] - mean[base]):+.2f} points; "
            f"per seed {', '.join(f'{100 * (a - b):+.2f}' for a, b in zip(acc, base_acc, strict=True))}); "
            f"spread over seeds {spread[name]:.2f} vs {spread[base]:.2f} points"
        }
    ]
