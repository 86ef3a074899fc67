"""curves.png in the run dir when a run ends: training loss, validation top-1 (and, where the run
has them, top-1 without the weight average and without TTA) and the learning rate, each against
optimizer steps and against wall-clock seconds since the run's first event."""

from __future__ import annotations

import json
from pathlib import Path

from turbotrain.core.atomic import atomic_write

PANELS = (  # (title, split, metric keys)
    ("training loss", "train", ("loss",)),
    ("validation top-1", "val", ("acc1", "acc1_no_ema", "acc1_no_tta")),
    ("learning rate", "train", ("lr",)),
)


def read_events(run_dir: Path) -> list[dict]:
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def write_curves(run_dir: Path) -> Path:
    """Draw metrics.jsonl into run_dir/curves.png."""
    # here, not at the top: only the run's end needs it. A bare Figure on the Agg canvas, not
    # pyplot: no backend search and no GUI modules, half a second less of every run's wall time
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    events = read_events(run_dir)
    start = min((e["time"] for e in events), default=0.0)
    fig = Figure(figsize=(11, 9))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(PANELS), 2, squeeze=False)
    for row, (title, split, keys) in enumerate(PANELS):
        for col, x_key in enumerate(("step", "seconds")):
            ax = axes[row][col]
            for key in keys:
                points = [
                    (e["step"] if x_key == "step" else e["time"] - start, e[key])
                    for e in events
                    if e["split"] == split and key in e
                ]
                if points:
                    ax.plot(*zip(*points), marker="." if split == "val" else None, label=key)
            ax.set_title(title)
            ax.set_xlabel("optimizer steps" if x_key == "step" else "seconds since the first event")
            if len(keys) > 1:
                ax.legend()
    # fixed margins for this grid: tight_layout measures every label's text, a third of the drawing time
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.06, top=0.96, hspace=0.42, wspace=0.18)
    path = Path(run_dir) / "curves.png"
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=80))
    return path
