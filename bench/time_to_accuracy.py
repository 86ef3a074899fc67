"""Time to accuracy: recipes as a user runs them (`python train.py ...`, a fresh process each,
the whole command's wall time), top-1 per seed, and an ablation of the speedrun.

`python -m bench time_to_accuracy` (about 25 minutes on 2 CPU cores) writes
bench/results/time_to_accuracy.json and docs/assets/time_to_accuracy.png (top-1 against wall seconds). Runs
are interleaved by seed: one of each recipe per round, so a slow minute of the machine falls on
all of them. The README's rows and its time-to-accuracy section are computed from the raw runs.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from bench.common import train_py, write
from bench.readme import ASSETS

TARGET = 0.915  # the speedrun's target: Fashion-MNIST test top-1
LONG_TARGET = 0.93  # the longer recipe's, within the default recipe's wall time

# name -> (train.py overrides, seeds); the speedrun ablation removes one technique each
RECIPES = {
    "default": ([], 3),
    "speedrun": (["experiment=speedrun"], 5),
    "speedrun_93": (["experiment=speedrun_93"], 3),
}
ABLATION = {  # technique -> the override that removes it from the speedrun
    "narrow first block (widths 16, 48, 128)": "model.widths=[32,64,128]",
    "patch-whitening first layer": "model.whiten=false",
    "label smoothing 0.1": "trainer.label_smoothing=0",
    "flip TTA": "trainer.tta=none",
    "random flips in training": "data.augment=[]",
    "linear (triangular) one-cycle annealing, not cosine": "sched.anneal_strategy=cos",
    "Nesterov momentum": "optim.nesterov=false",
    "bf16 autocast (where the CPU has it)": "precision=fp32",
}
ABLATION_SEEDS = 2


def timed_run(overrides: list[str], seed: int) -> dict:
    """One `python train.py` in a fresh process: its wall time, and each validation's top-1
    with the seconds since the command started."""
    started, t0 = time.time(), time.perf_counter()
    events, summary = train_py(*overrides, f"trainer.seed={seed}")
    wall = time.perf_counter() - t0  # the process, plus reading back two small files
    vals = [{"s": e["time"] - started, "acc1": e["acc1"], "step": e["step"]} for e in events if e["split"] == "val"]
    return {
        "seed": seed,
        "wall_s": wall,
        "acc1": vals[-1]["acc1"],
        "vals": vals,
        "precision": summary["autocast_dtype"] or "fp32",
    }


def time_to(run: dict, target: float) -> float | None:
    return next((v["s"] for v in run["vals"] if v["acc1"] >= target), None)


def run() -> Path:
    results: dict[str, list[dict]] = {name: [] for name in RECIPES}
    ablation: dict[str, list[dict]] = {name: [] for name in ABLATION}
    for seed in range(max(seeds for _, seeds in RECIPES.values())):
        for name, (overrides, seeds) in RECIPES.items():
            if seed < seeds:
                print(f"time_to_accuracy: {name} seed {seed} ...", flush=True)
                results[name].append(timed_run(overrides, seed))
        for name, override in ABLATION.items():
            if seed < ABLATION_SEEDS:
                print(f"time_to_accuracy: speedrun without {name} seed {seed} ...", flush=True)
                ablation[name].append(timed_run([*RECIPES["speedrun"][0], override], seed))
    payload = {
        "target": TARGET,
        "long_target": LONG_TARGET,
        "recipes": {n: {"overrides": RECIPES[n][0], "runs": r} for n, r in results.items()},
        "ablation": {n: {"override": ABLATION[n], "runs": r} for n, r in ablation.items()},
        "rows": [{"what": f"time to >= {TARGET:.1%} top-1 on Fashion-MNIST: speedrun vs the default recipe", "seed": ""}],
    }
    path = write("time_to_accuracy", payload)
    draw(payload, ASSETS / "time_to_accuracy.png")
    return path


def summary(runs: list[dict]) -> dict:
    accs = [r["acc1"] for r in runs]
    return {"wall_s": statistics.median(r["wall_s"] for r in runs), "mean": statistics.mean(accs), "min": min(accs)}


def figures(result: dict) -> list[dict]:
    """The comparison row: the default recipe's median wall time over the speedrun's."""
    default, speedrun = (summary(result["recipes"][n]["runs"]) for n in ("default", "speedrun"))
    ratio = default["wall_s"] / speedrun["wall_s"]
    return [
        {
            "ours": f"{ratio:.1f}x ({speedrun['wall_s']:.1f} s vs {default['wall_s']:.1f} s median wall, mean top-1 "
            f"{speedrun['mean']:.2%} vs {default['mean']:.2%})",
            "ratio": ratio,
        }
    ]


def _reached(runs: list[dict], target: float) -> str:
    times = [t for t in (time_to(r, target) for r in runs) if t is not None]
    if len(times) < len(runs):
        return f"reached in {len(times)} of {len(runs)} runs"
    return f"{statistics.median(times):.1f} s"


def section(results: Path) -> str:
    """The README's time-to-accuracy tables, computed from the runs in the result file."""
    from bench.readme import machine

    path = results / "time_to_accuracy.json"
    result = json.loads(path.read_text())
    recipes, target = result["recipes"], result["target"]
    default = summary(recipes["default"]["runs"])
    lines = [
        f"Measured on {machine(result['hardware'])} by `python -m bench time_to_accuracy` "
        f"(`bench/results/{path.name}`), fresh processes interleaved by seed:",
        "",
        "| command | median wall time (whole command) | top-1 per seed | mean (lowest) | wall vs default |",
        "|---|---|---|---|---|",
    ]
    for recipe in recipes.values():
        s, runs = summary(recipe["runs"]), recipe["runs"]
        command = " ".join(["`python train.py", *recipe["overrides"]]) + "`"
        per_seed = ", ".join(f"{r['acc1']:.2%}" for r in runs)
        lines.append(
            f"| {command} | {s['wall_s']:.1f} s | {per_seed} | {s['mean']:.2%} ({s['min']:.2%}) | "
            f"{s['wall_s'] / default['wall_s']:.2f}x |"
        )
    speedrun = recipes["speedrun"]["runs"]
    lines += [
        "",
        f"The speedrun with one technique removed ({ABLATION_SEEDS} seeds each; the speedrun's own figures are "
        f"those seeds' runs above):",
        "",
        f"| removed | override | median wall time | time to {target:.1%} | mean top-1 | top-1 vs the speedrun |",
        "|---|---|---|---|---|---|",
    ]
    for name, entry in result["ablation"].items():
        runs = entry["runs"]
        base = statistics.mean(r["acc1"] for r in speedrun if r["seed"] in {a["seed"] for a in runs})
        s = summary(runs)
        lines.append(
            f"| {name} | `{entry['override']}` | {s['wall_s']:.1f} s | {_reached(runs, target)} | {s['mean']:.2%} | "
            f"{100 * (s['mean'] - base):+.2f} points |"
        )
    return "\n".join([*lines, "", "![top-1 against wall time](assets/time_to_accuracy.png)"])


def draw(result: dict, path: Path) -> None:
    """Validation top-1 against seconds since the command started: one line per run."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 5.5))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for color, (name, recipe) in zip(("#777", "#c40", "#27a"), result["recipes"].items(), strict=False):
        for i, r in enumerate(recipe["runs"]):
            ax.plot(
                [v["s"] for v in r["vals"]],
                [v["acc1"] for v in r["vals"]],
                ".-",
                color=color,
                alpha=0.7,
                label=name if i == 0 else None,
            )
    for target in (result["target"], result["long_target"]):
        ax.axhline(target, color="black", linewidth=0.6, linestyle=":")
    ax.set_ylim(0.85, 0.95)
    ax.set_xlabel("seconds since `python train.py` started")
    ax.set_ylabel("validation top-1 (Fashion-MNIST test set)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    print(run())
