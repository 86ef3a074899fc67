"""What every benchmark shares: hardware facts, interleaved repeats, result files."""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from turbotrain.core.atomic import atomic_write_text
from turbotrain.core.cpu import cpu_flags

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]


ISA = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")  # what decides CPU kernels' speed


def cpu_isa() -> list[str]:
    """The vector and matrix instruction sets of ISA that this CPU has (Linux)."""
    return [f for f in ISA if f in (cpu_flags() or ())]


def hardware() -> dict:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "isa": cpu_isa(),
        "cores": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def interleave(candidates: dict[str, Callable[[], float]], repeats: int) -> dict[str, dict]:
    """Run each candidate once per round, rounds alternating A, B, A, B...; each call returns one
    measurement (a rate, or a time). Returns median and all values per candidate."""
    values: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, fn in candidates.items():
            values[name].append(fn())
    return {name: {"median": statistics.median(v), "values": v} for name, v in values.items()}


def in_fresh_process(module: str, call: str) -> dict:
    """What `bench.<module>.<call>` returns, run in a new Python process: its own peak-RSS
    high-water mark, its own compiler state. The call prints nothing else on its last line."""
    code = f"import json, bench.{module} as m; print(json.dumps(m.{call}))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def train_py(*overrides: str) -> tuple[list[dict], dict]:
    """Run `python train.py <overrides>` in a fresh process and temp run dir; returns its
    metrics.jsonl events and summary.json (the same figures a user sees)."""
    with tempfile.TemporaryDirectory() as tmp:
        args = ["trainer.progress_bar=false", *overrides, f"hydra.run.dir={tmp}"]
        done = subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"train.py {' '.join(overrides)} failed:\n{done.stderr[-2000:]}")
        events = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
        return events, json.loads((Path(tmp) / "summary.json").read_text())


def steady_rate(events: list[dict]) -> float:
    """Median samples/s of the train log intervals after the first quarter (warm-up)."""
    rates = [e["samples_per_s"] for e in events if e["split"] == "train"]
    return statistics.median(rates[len(rates) // 4 :])


def write(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {"bench": name, "hardware": hardware(), "date": time.strftime("%Y-%m-%d"), **payload}
    path = RESULTS / f"{name}.json"
    atomic_write_text(path, json.dumps(payload, indent=2) + "\n")  # an hour of measurements must not be half-written
    return path


def labelled(labels: list[tuple[str, str]], figures: list[dict]) -> list[dict]:
    """Result rows: each (what is compared, the seed's claim) with its figures (ours, ratio)."""
    return [{"what": what, "seed": seed, **f} for (what, seed), f in zip(labels, figures, strict=True)]
