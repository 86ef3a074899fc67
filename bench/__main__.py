"""`python -m bench [name ...]`: run benchmarks (default: all), write bench/results/, regenerate the
README's figures. `python -m bench readme [--check]`: regenerate (or check) them alone, with the
configuration reference (docs/reference.md)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from turbotrain.core.atomic import atomic_write_text

# name -> (module, function, keyword arguments); imported on demand, so `readme` starts fast.
BENCHES = {  # CPU sizes: minutes each on 2 cores
    "recipes": ("recipes", "run", {}),
    "precision": ("train_speed", "precision_channels_last", {}),
    "text_precision": ("train_speed", "text_precision", {}),
    "inference": ("inference", "run", {}),
    "deploy_onnx": ("deploy_onnx", "run", {}),  # reads (or trains) runs of the recipes bench
    "loader": ("loader", "run", {}),
    "loader_in_memory": ("loader", "in_memory", {}),
    "loader_in_memory_accuracy": ("loader", "in_memory_accuracy", {}),
    "malloc": ("malloc", "run", {}),
    "loader_cached": ("decoded", "cached", {}),
    "loader_pipeline": ("decoded", "pipeline_alone", {}),
    "loader_cached_accuracy": ("decoded", "cached_accuracy", {}),
    "loader_cached_accuracy_224px": ("decoded", "cached_accuracy", {"cache_size": 224}),  # the files' own size
    "autotune": ("autotune", "run", {}),
    "resolution": ("resolution", "run", {}),
    "prune": ("prune", "run", {}),  # reads two of the recipes' runs
    "conv_lowrank": ("prune", "run", {"name": "conv_lowrank"}),  # and this one, a third
    "attention": ("attention", "run", {"repeats": 3}),
    "attention_flex": ("attention_flex", "run", {}),  # ~3
    "attention_accuracy": ("attention_accuracy", "run", {}),  # ~60
    "overhead": ("overhead", "run", {}),
    "skip_sync": ("skip_sync", "run", {}),
    "time_to_accuracy": ("time_to_accuracy", "run", {}),  # ~25
    "time_to_accuracy_text": ("time_to_accuracy", "run", {"task": "text"}),  # ~60
    "data_scale": ("data_scale", "run", {}),  # ~40, most of it writing the trees and their copies once
    "cache_index": ("cache_index", "run", {}),  # ~3
}
ON_REQUEST = {  # named only: hours on 2 cores, and it measures the tests, not the code's speed
    "mutation": ("mutation", "run", {}),
}

GPU_BENCHES = {  # bench/gpu_check.sh: GPU sizes, fp16 AMP + GradScaler, pinned memory; ~8 minutes in all
    "precision": ("train_speed", "precision_channels_last", {"repeats": 3, "steps": 20, "size": 224, "batch": 128}),
    "text_precision": ("train_speed", "text_precision", {"repeats": 3, "steps": 10, "batch": 128}),
    "loader": ("loader", "run", {"repeats": 2, "batches": 40, "size": 224, "batch": 128}),
    "overhead": ("overhead", "run", {"repeats": 3, "steps": 150, "batch": 128, "size": 128}),
    "skip_sync": ("skip_sync", "run", {}),
}


def _run(spec: tuple[str, str, dict]):
    module, function, kwargs = spec
    return getattr(importlib.import_module(f"bench.{module}"), function)(**kwargs)


def _readme(check: bool) -> int:
    from bench import readme

    if not check:
        readme.update()
        atomic_write_text(readme.REFERENCE, _reference())
        print("README.md and docs/: generated sections and docs/reference.md rewritten")
        return 0
    diff = readme.check()
    if readme.REFERENCE.read_text() != _reference():
        diff.append(f"{readme.REFERENCE} differs from the schemas")
    if diff:
        print("the docs differ from bench/results/ or the schemas; run `python -m bench readme`:", *diff[:60], sep="\n")
        return 1
    print("README.md and docs/ match bench/results/ and the schemas")
    return 0


def _reference() -> str:
    """docs/reference.md's text, from the schemas of every registered option."""
    import turbotrain.options  # noqa: F401  (fills the option registries)
    from turbotrain.config import reference

    return reference.page()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    names = [[], "readme", *BENCHES, *ON_REQUEST]
    parser.add_argument("names", nargs="*", choices=names, help="benchmarks to run (default: all but ON_REQUEST's)")
    parser.add_argument("--gpu", action="store_true", help="GPU sizes, results in bench/results/gpu/ (docs untouched)")
    parser.add_argument("--check", action="store_true", help="with `readme`: fail if README.md or docs/ differ from the results")
    args = parser.parse_args()
    if args.names == ["readme"]:
        return _readme(args.check)
    os.environ.setdefault("WANDB_MODE", "disabled")
    benches = GPU_BENCHES if args.gpu else {**BENCHES, **ON_REQUEST}
    if args.gpu:
        from bench import common

        common.RESULTS = common.RESULTS / "gpu"
    for name in args.names or list(GPU_BENCHES if args.gpu else BENCHES):
        if name not in benches:
            print(f"{name}: no {'GPU' if args.gpu else 'CPU'} version, skipped")
            continue
        print(f"{name}: wrote {_run(benches[name])}")
    return 0 if args.gpu else _readme(check=False)


if __name__ == "__main__":
    sys.exit(main())
