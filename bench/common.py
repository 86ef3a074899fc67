"""What every benchmark shares: hardware facts, interleaved repeats, result files, README table."""

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

RESULTS = Path(__file__).resolve().parent / "results"
README = Path(__file__).resolve().parents[1] / "README.md"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"


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
        "cores": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def interleave(candidates: dict[str, Callable[[], float]], repeats: int) -> dict[str, dict]:
    """Run each candidate once per round, rounds alternating A, B, A, B...; each call returns a
    rate (higher is better). Returns median and all values per candidate."""
    values: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, fn in candidates.items():
            values[name].append(fn())
    return {name: {"median": statistics.median(v), "values": v} for name, v in values.items()}


def train_py(*overrides: str) -> tuple[list[dict], dict]:
    """Run `python train.py <overrides>` in a fresh process and temp run dir; returns its
    metrics.jsonl events and summary.json (the same figures a user sees)."""
    with tempfile.TemporaryDirectory() as tmp:
        args = ["trainer.progress_bar=false", *overrides, f"hydra.run.dir={tmp}"]
        done = subprocess.run([sys.executable, "train.py", *args], cwd=README.parent, capture_output=True, text=True)
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
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def plot(ratios: list[tuple[str, float]], path: Path) -> None:
    """One horizontal bar per comparison that has a ratio (x: speed-up, 1 = no change)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 0.38 * len(ratios) + 1.2))
    labels = [label if len(label) <= 95 else label[:92] + "..." for label, _ in ratios]
    values = [v for _, v in ratios]
    ax.barh(range(len(values)), values, color=["#2a7" if v >= 1 else "#c44" for v in values])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(values)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ticks = [t for t in (0.25, 0.5, 1, 2, 4, 8, 16) if min(values) / 1.5 <= t <= max(values) * 1.5]
    ax.set_xticks(ticks, [f"{t:g}x" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("ratio (higher is better; 1 = baseline), medians of interleaved repeats")
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:.2f}x", va="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def update_readme() -> None:
    """Regenerate the table between the bench markers from every results file's `rows`, and the
    plot of every row's ratio (bench/results/ratios.png)."""
    rows, ratios = [], []
    for path in sorted(RESULTS.glob("*.json")):
        result = json.loads(path.read_text())
        hw = result["hardware"]
        where = hw["gpu"] or f"{hw['cores']}-thread CPU"
        for row in result.get("rows", []):
            if row.get("ratio"):
                ratios.append((row["what"], row["ratio"]))
            rows.append(
                f"| {row['what']} | {row['seed']} | {row['ours']} | {where}, torch {hw['torch'].split('+')[0]} "
                f"| `{path.relative_to(README.parent)}` |"
            )
    table = "\n".join(
        [
            START,
            "| comparison | seed claim | measured here (median of interleaved repeats) | hardware | result |",
            "|---|---|---|---|---|",
            *rows,
            "",
            "![ratios](bench/results/ratios.png)",
            END,
        ]
    )
    text = README.read_text()
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    README.write_text(head + table + tail)
    if ratios:
        plot(ratios, RESULTS / "ratios.png")
