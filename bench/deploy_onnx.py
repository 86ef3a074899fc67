"""ONNX Runtime deployment of trained runs: `python export.py deploy=onnx_int8 run=<run>`, a fresh
process as a user types it, on small_cnn (the default run), resnet18 and mobilenet_v3_small at
64 px on Fashion-MNIST and MiniLM on WordNet. Each row comes from that export's report.json:
ORT INT8 size against the ORT fp32 graph, top-1 against the float model on the validation
split, and latency at batch 1 and 32 of ORT INT8, ORT fp32, TorchScript INT8 and fp32 eager,
timed in the one export.

Reads the recipes bench's runs in outputs/bench/ and trains those missing there (about an hour
on 2 CPU cores for all four; the exports alone take minutes). `python -m bench.deploy_onnx NAME
...` reruns some and keeps the others' entries.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from bench.common import RESULTS, hardware, labelled, write
from bench.recipes import RECIPES, RUNS, timed

# run name -> (what the row calls it, train.py overrides of a missing run)
MODELS = {
    "default": ("small_cnn @28px Fashion-MNIST (the default run)", RECIPES["default"][1]),
    "resnet18_fashion": ("resnet18 @64px Fashion-MNIST", RECIPES["resnet18_fashion"][1]),
    "mobilenet_v3_small": (
        "mobilenet_v3_small @64px Fashion-MNIST",
        ["model=mobilenet_v3_small", "data.image_size=64", "data.batch_size=128", "trainer.max_epochs=2"],
    ),
    "wordnet_minilm": ("MiniLM-L6 WordNet (dynamic INT8)", RECIPES["wordnet_minilm"][1]),
}
SEED = "ORT INT8 <= 0.30x fp32 size, top-1 within 0.5 points (MiniLM 1); resnet18 batch 1 at least as fast as TorchScript INT8"
REPORT_KEYS = (
    "opset",
    "onnxruntime",
    "dtype",
    "activation_weight_types",
    "reduce_range",
    "quantized_ops",
    "size_mb",
    "onnx_fp32_size_mb",
    "fp32_size_mb",
    "val_acc1",
    "onnx_fp32_val_acc1",
    "fp32_val_acc1",
    "val_samples",
    "threads",
    *(f"{k}latency_ms{b}" for k in ("", "onnx_fp32_", "torchscript_int8_", "fp32_") for b in ("", "_b32")),
)


RUNTIMES = {"": "ORT INT8", "onnx_fp32_": "ORT fp32", "torchscript_int8_": "TorchScript INT8", "fp32_": "fp32 eager"}


def _figures(r: dict) -> dict:
    ms = ", ".join(f"{label} {r[f'{k}latency_ms']:.2f} / {r[f'{k}latency_ms_b32']:.1f}" for k, label in RUNTIMES.items())
    speed = r["torchscript_int8_latency_ms"] / r["latency_ms"]
    return {
        "ours": f"{r['size_mb'] / r['onnx_fp32_size_mb']:.2f}x the ORT fp32 size ({r['size_mb']:.2f} vs "
        f"{r['onnx_fp32_size_mb']:.2f} MB); top-1 {r['val_acc1']:.2%} vs {r['fp32_val_acc1']:.2%} float "
        f"({100 * (r['val_acc1'] - r['fp32_val_acc1']):+.2f} points); ms at batch 1 / 32: {ms}; "
        f"ORT INT8 {speed:.2f}x TorchScript INT8's speed at batch 1",
        "ratio": speed,
    }


def figures(result: dict) -> list[dict]:
    return [_figures(result["exports"][name]["report"]) for name in MODELS if name in result["exports"]]


def export(name: str) -> dict:
    """Train the run if outputs/bench lacks it, export it to ONNX INT8 in a fresh process."""
    what, overrides = MODELS[name]
    run_dir = RUNS / name
    if not (run_dir / "summary.json").is_file():
        print(f"deploy_onnx: training {name} ...", flush=True)
        timed(["train.py", "trainer.progress_bar=false", *overrides, f"hydra.run.dir={run_dir}"])
    wall_s = timed(["export.py", "deploy=onnx_int8", f"run={run_dir}"])
    report = json.loads((run_dir / "export" / "onnx_int8" / "report.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "what": what,
        "train_overrides": overrides,
        "best_val_acc1": summary["best_val_acc1"],
        "export_wall_s": wall_s,
        "hardware": hardware(),
        "date": time.strftime("%Y-%m-%d"),
        "report": {k: report[k] for k in REPORT_KEYS},
    }


def run(names: list[str] | None = None) -> Path:
    path = RESULTS / "deploy_onnx.json"
    exports = json.loads(path.read_text())["exports"] if path.exists() else {}
    for name in names or list(MODELS):
        exports[name] = export(name)
        kept = {n: exports[n] for n in MODELS if n in exports}
        labels = [(f"ONNX Runtime INT8 export, {kept[n]['what']}", SEED) for n in kept]
        write("deploy_onnx", {"exports": kept, "rows": labelled(labels, figures({"exports": kept}))})
    return path


if __name__ == "__main__":
    print(run(sys.argv[1:] or None))
