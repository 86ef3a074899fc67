"""`python train.py` (defaults) with trainer.malloc=retain (the default) against glibc's own
settings: samples/s and data wait, arms alternating, as train.py reports them. Memory a step
frees is handed back to the kernel under glibc's defaults and faulted in again by the next step;
small steps (the default run's) feel it most, in the model and in the data wait alike."""

from __future__ import annotations

from pathlib import Path

from bench.common import labelled, write
from bench.loader import _measure, figures, short_epoch


def run(repeats: int = 5, batches: int = 150) -> Path:
    arms = {"malloc=system": ("trainer.malloc=system",), "malloc=retain": ()}
    results = _measure(arms, short_epoch(batches), repeats)
    rows = labelled(
        [("`python train.py` defaults (Fashion-MNIST in memory): trainer.malloc=retain (the default) vs glibc's defaults", "-")],
        figures({"results": results}),
    )
    return write("malloc", {"results": results, "rows": rows})


if __name__ == "__main__":
    print(run())
