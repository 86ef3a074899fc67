"""Pipeline overhead: `python train.py` against a minimal hand-written loop (bench/minimal_loop.py)
on the same model (resnet18 @32 px), batch, autocast and threads, data in memory (synthetic:
speed only). Each run is its own process, the two alternate; medians of the repeats.
Steady state: every timed step lies in train.py's first epoch, so no validation or checkpoint
falls between them (those are per-epoch costs, amortized over a real epoch).
Time to first step counts from process start (imports, data, model, first step)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from bench.common import labelled, steady_rate, train_py, write

ROOT = Path(__file__).resolve().parents[1]


def _minimal(steps: int, batch: int, size: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "bench.minimal_loop", str(steps), str(batch), str(size)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _turbotrain(steps: int, batch: int, size: int) -> dict:
    events, summary = train_py(
        "data=synthetic",
        f"data.image_size={size}",
        f"data.num_samples={batch * (steps + 8) * 5 // 4}",  # one epoch holds every step (after the 20% val split)
        f"data.batch_size={batch}",
        "model=resnet18",
        "precision=amp",
        "trainer.channels_last=false",
        "sched=none",
        "optim.nesterov=false",
        "optim.weight_decay=0",
        f"trainer.max_steps={steps}",
        "trainer.max_epochs=1000",
        "trainer.limit_val_batches=1",
        "trainer.log_every_n_steps=5",
    )
    return {"first_step_s": summary["time_to_first_step_s"], "samples_per_s": steady_rate(events)}


def figures(result: dict) -> list[dict]:
    med = {
        k: {m: statistics.median(r[m] for r in v) for m in ("first_step_s", "samples_per_s")}
        for k, v in result["results"].items()
    }
    ratio = med["turbotrain"]["samples_per_s"] / med["minimal"]["samples_per_s"]
    extra = med["turbotrain"]["first_step_s"] - med["minimal"]["first_step_s"]
    return [
        {
            "ours": f"{ratio:.3f}x ({med['turbotrain']['samples_per_s']:.0f} vs {med['minimal']['samples_per_s']:.0f} samples/s)",
            "ratio": ratio,
        },
        {"ours": f"{med['turbotrain']['first_step_s']:.1f} s vs {med['minimal']['first_step_s']:.1f} s ({extra:+.1f} s)"},
    ]


def run(repeats: int = 5, steps: int = 120, batch: int = 64, size: int = 32) -> Path:
    results: dict[str, list[dict]] = {"minimal": [], "turbotrain": []}
    for _ in range(repeats):
        results["minimal"].append(_minimal(steps, batch, size))
        results["turbotrain"].append(_turbotrain(steps, batch, size))
    labels = [
        (
            f"pipeline overhead: train.py vs a minimal loop (resnet18 @{size}px, batch {batch}, amp, steady state)",
            ">= 0.98x; Lightning ~0.99-1.02x, timm ~0.85x",
        ),
        ("time from process start to first training step", "<= minimal + 2 s (Lightning 6-8 s)"),
    ]
    rows = labelled(labels, figures({"results": results}))
    return write("overhead", {"results": results, "rows": rows})


if __name__ == "__main__":
    print(run())
