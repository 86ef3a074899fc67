"""The README's headline runs end to end, as a user types them: `train.py`, then `export.py
deploy=int8`, each a fresh process. Records accuracy, wall time, throughput, sizes and latencies
into bench/results/recipes.json; the README's main table is generated from that file.

`python -m bench recipes` runs all (about 35 minutes on 2 CPU cores); `python -m bench.recipes
NAME ...` reruns some and keeps the others' entries. Run dirs stay in outputs/bench/<name>/
(the compression benches read three of them).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.common import RESULTS, ROOT, hardware, write

RUNS = ROOT / "outputs" / "bench"

# name -> (what the README calls it, train.py overrides); order matters: the pruned and the
# factorized runs start from the resnet18 run.
RECIPES = {
    "default": ("`python train.py` (defaults)", []),
    "resnet18_fashion": ("`python train.py experiment=resnet18_fashion`", ["experiment=resnet18_fashion"]),
    "resnet18_pruned": (
        "then `compression=channel_prune compression.from_run=<that run> trainer.max_epochs=1`",
        [
            "experiment=resnet18_fashion",
            "compression=channel_prune",
            f"compression.from_run={(RUNS / 'resnet18_fashion').relative_to(ROOT)}",
            "trainer.max_epochs=1",
        ],
    ),
    "resnet18_conv_lowrank": (
        "or `compression=conv_lowrank compression.from_run=<that run> trainer.max_epochs=1`",
        [
            "experiment=resnet18_fashion",
            "compression=conv_lowrank",
            f"compression.from_run={(RUNS / 'resnet18_fashion').relative_to(ROOT)}",
            "trainer.max_epochs=1",
        ],
    ),
    "wordnet_minilm": ("`python train.py experiment=wordnet_minilm`", ["experiment=wordnet_minilm"]),
}
REPORT_KEYS = (
    "size_mb",
    "fp32_size_mb",
    "latency_ms",
    "fp32_latency_ms",
    "latency_ms_b32",
    "fp32_latency_ms_b32",
    "val_acc1",
    "fp32_val_acc1",
    "val_samples",
    "dtype",
    "method",
)


def timed(args: list[str]) -> float:
    """Run one entry point as a user would; returns its wall time in seconds."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def run_recipe(name: str) -> dict:
    what, overrides = RECIPES[name]
    run_dir = RUNS / name
    shutil.rmtree(run_dir, ignore_errors=True)
    train_s = timed(["train.py", "trainer.progress_bar=false", *overrides, f"hydra.run.dir={run_dir}"])
    summary = json.loads((run_dir / "summary.json").read_text())
    export_s = timed(["export.py", "deploy=int8", f"run={run_dir}"])
    report = json.loads((run_dir / "export" / "int8" / "report.json").read_text())
    return {
        "what": what,
        "overrides": overrides,
        "hardware": hardware(),
        "date": time.strftime("%Y-%m-%d"),
        "train": {
            "wall_s": train_s,
            "train_time_s": summary["train_time_s"],
            "best_val_acc1": summary["best_val_acc1"],
            "samples_per_s": summary["samples_per_s"],
            "params": summary["params"],
            "epochs": summary["epochs"],
            "precision": summary["precision"],
            "autocast_dtype": summary["autocast_dtype"],
            "compression": summary["compression"],
        },
        "export": {"wall_s": export_s, **{k: report[k] for k in REPORT_KEYS}},
    }


def run(names: list[str] | None = None) -> Path:
    path = RESULTS / "recipes.json"
    recipes = json.loads(path.read_text())["recipes"] if path.exists() else {}
    for name in names or list(RECIPES):
        print(f"recipes: {name} ...", flush=True)
        recipes[name] = run_recipe(name)
        write("recipes", {"recipes": {n: recipes[n] for n in RECIPES if n in recipes}})  # each as it ends
    return path


if __name__ == "__main__":
    print(run(sys.argv[1:] or None))
