"""What every benchmark shares: hardware facts, interleaved repeats, result files, README table."""

from __future__ import annotations

import json
import platform
import statistics
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


def write(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {"bench": name, "hardware": hardware(), "date": time.strftime("%Y-%m-%d"), **payload}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def update_readme() -> None:
    """Regenerate the table between the bench markers from every results file's `rows`."""
    rows = []
    for path in sorted(RESULTS.glob("*.json")):
        result = json.loads(path.read_text())
        hw = result["hardware"]
        where = hw["gpu"] or f"{hw['cores']}-thread CPU"
        for row in result.get("rows", []):
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
            END,
        ]
    )
    text = README.read_text()
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    README.write_text(head + table + tail)
