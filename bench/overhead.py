"""Pipeline overhead: `python train.py` against a minimal hand-written loop (bench/minimal_loop.py)
on the same model (resnet18 @32 px), batch, bf16 autocast and threads, data in memory (synthetic:
speed only). Each run is its own process, the two alternate; medians of the repeats.
Time to first step counts from process start (imports, data, model, first step)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import write

ROOT = Path(__file__).resolve().parents[1]
STEPS, BATCH, SIZE = 120, 64, 32


def _minimal() -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "bench.minimal_loop", str(STEPS), str(BATCH), str(SIZE)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _turbotrain() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "data=synthetic",
            f"data.image_size={SIZE}",
            f"data.num_samples={BATCH * 16 * 5 // 4}",  # the same 16 batches per epoch after the 20% val split
            f"data.batch_size={BATCH}",
            "model=resnet18",
            "precision=amp",
            "trainer.channels_last=false",
            "sched=none",
            "optim.nesterov=false",
            "optim.weight_decay=0",
            f"trainer.max_steps={STEPS}",
            "trainer.max_epochs=1000",
            "trainer.limit_val_batches=1",
            "trainer.log_every_n_steps=5",
            "trainer.progress_bar=false",
            f"hydra.run.dir={tmp}",
        ]
        subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True, check=True)
        events = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
        summary = json.loads((Path(tmp) / "summary.json").read_text())
    rates = [e["samples_per_s"] for e in events if e["split"] == "train"]
    return {"first_step_s": summary["time_to_first_step_s"], "samples_per_s": statistics.median(rates[len(rates) // 4 :])}


def run(repeats: int = 3) -> Path:
    results: dict[str, list[dict]] = {"minimal": [], "turbotrain": []}
    for _ in range(repeats):
        results["minimal"].append(_minimal())
        results["turbotrain"].append(_turbotrain())
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("first_step_s", "samples_per_s")} for k, v in results.items()}
    ratio = med["turbotrain"]["samples_per_s"] / med["minimal"]["samples_per_s"]
    extra = med["turbotrain"]["first_step_s"] - med["minimal"]["first_step_s"]
    rows = [
        {
            "what": "pipeline overhead: train.py vs a minimal loop (resnet18 @32px, bf16, steady state)",
            "seed": ">= 0.98x; Lightning ~0.99-1.02x, timm ~0.85x",
            "ours": f"{ratio:.3f}x ({med['turbotrain']['samples_per_s']:.0f} vs {med['minimal']['samples_per_s']:.0f} samples/s)",
        },
        {
            "what": "time from process start to first training step",
            "seed": "<= minimal + 2 s (Lightning 6-8 s)",
            "ours": f"{med['turbotrain']['first_step_s']:.1f} s vs {med['minimal']['first_step_s']:.1f} s (+{extra:.1f} s)",
        },
    ]
    return write("overhead", {"results": results, "median": med, "rows": rows})


if __name__ == "__main__":
    print(run())
