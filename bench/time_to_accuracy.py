"""Time to accuracy: recipes as a user runs them (`python train.py ...`, a fresh process each,
the whole command's wall time), top-1 per seed, and an ablation of each task's speedrun.

`python -m bench time_to_accuracy` (images, about 45 minutes on 2 CPU cores) and `python -m bench
time_to_accuracy_text` (about 90) write bench/results/<task's result>_<path>.json and
docs/assets/<same>.png (top-1 against wall seconds), where path is bf16 or fp32: the precision the
CPU gives the recipes, so a bf16 machine and an AVX2 one each keep their own file. Runs are
interleaved by seed: one of each recipe per round, so a slow minute of the machine falls on all
of them. The docs' rows and time-to-accuracy sections are computed from the raw runs."""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import train_py, write
from bench.readme import ASSETS


@dataclass(frozen=True)
class Task:
    """A recipe family: its result file, its target, the recipes (name -> train.py overrides,
    seeds; the first is the 1.00x every ratio is against), the ablation of its speedrun
    (technique -> the override that removes it) and its trials (a technique the speedrun does
    not use -> the override that adds it)."""

    result: str  # bench/results/<result>.json, docs/assets/<result>.png
    metric: str  # what the top-1 is measured on
    target: float
    long_target: float | None  # a longer recipe's target, drawn on the curves too
    recipes: dict[str, tuple[list[str], int]]
    speedrun: str
    ablation: dict[str, str]
    trials: dict[str, str] = field(default_factory=dict)
    ablation_seeds: int = 2  # the ablation's and the trials'


CHANGES = {"ablation": "removed", "trials": "added"}  # the Task's fields of one-technique changes to the speedrun
PATHS = ("bf16", "fp32")  # bf16 autocast where the CPU has native bf16, else fp32
TASKS = {
    "images": Task(
        "time_to_accuracy",
        "Fashion-MNIST test set",
        0.915,
        0.93,
        {"default": ([], 3), "speedrun": (["experiment=speedrun"], 5), "speedrun_93": (["experiment=speedrun_93"], 3)},
        "speedrun",
        {
            "narrow first and last blocks (widths 16, 48, 96)": "model.widths=[32,64,128]",
            "patch-whitening first layer": "model.whiten=false",
            "label smoothing 0.1": "trainer.label_smoothing=0",
            "flip TTA": "trainer.tta=none",
            "alternating flips (each image flipped every other epoch), not random": "data.augment=[{name: RandomHorizontalFlip}]",
            "flips in training": "data.augment=[]",
            "linear (triangular) one-cycle annealing, not cosine": "sched.anneal_strategy=cos",
            "Nesterov momentum": "optim.nesterov=false",
            "bf16 autocast (where the CPU has it)": "precision=fp32",
        },
        {
            "normalization layers at 64x the learning rate": "optim.norm_lr_scale=64",
            "identity (Dirac) start of each block's first channels": "model.dirac=true",
            "multi-crop TTA (flip and 1-px shifts: 6 views)": "trainer.tta=flip_shift",
            "weight average (EMA, decay 0.99) for evaluation": "trainer.ema_decay=0.99",
        },
    ),
    "text": Task(
        "time_to_accuracy_text",
        "WordNet topics' validation split",
        0.95,
        None,
        {"wordnet_minilm": (["experiment=wordnet_minilm"], 3), "wordnet_speedrun": (["experiment=wordnet_speedrun"], 3)},
        "wordnet_speedrun",
        {
            "only the lowest 3 of MiniLM's 6 blocks (the classifier on block 3)": "model.layers=null",
            "lowest block frozen": "model.frozen_layers=0",
            "no dropout (MiniLM's is 0.1)": "model.dropout=null",
            "label smoothing 0.1": "trainer.label_smoothing=0",
            "learning rate 4e-4 (wordnet_minilm's is 5e-5)": "optim.lr=5e-5",
        },
        {
            "token embeddings frozen (half of MiniLM's weights)": "model.freeze_embeddings=true",
            "a fourth block (the lowest 4 of MiniLM's 6)": "model.layers=4",
        },
    ),
}


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
        "first_step_s": summary["time_to_first_step_s"],
        "startup_s": summary["startup_s"],
        "train_time_s": summary["train_time_s"],
    }


def time_to(run: dict, target: float) -> float | None:
    return next((v["s"] for v in run["vals"] if v["acc1"] >= target), None)


def run(task: str = "images") -> Path:
    t = TASKS[task]
    results: dict[str, list[dict]] = {name: [] for name in t.recipes}
    changed: dict[str, dict[str, list[dict]]] = {kind: {n: [] for n in getattr(t, kind)} for kind in CHANGES}
    for seed in range(max(seeds for _, seeds in t.recipes.values())):
        for name, (overrides, seeds) in t.recipes.items():
            if seed < seeds:
                print(f"time_to_accuracy: {name} seed {seed} ...", flush=True)
                results[name].append(timed_run(overrides, seed))
        for kind in CHANGES:
            for name, override in getattr(t, kind).items():
                if seed < t.ablation_seeds:
                    print(f"time_to_accuracy: {t.speedrun} {override} seed {seed} ...", flush=True)
                    changed[kind][name].append(timed_run([*t.recipes[t.speedrun][0], override], seed))
    baseline, path = next(iter(t.recipes)), _path(results[t.speedrun])
    payload = {
        "task": task,
        "target": t.target,
        "long_target": t.long_target,
        "recipes": {n: {"overrides": t.recipes[n][0], "runs": r} for n, r in results.items()},
        **{kind: {n: {"override": getattr(t, kind)[n], "runs": r} for n, r in runs.items()} for kind, runs in changed.items()},
        "rows": [{"what": f"time to >= {t.target:.1%} top-1 on the {t.metric} ({path}): {t.speedrun} vs {baseline}", "seed": ""}],
    }
    draw(payload, ASSETS / f"{t.result}_{path}.png")
    return write(f"{t.result}_{path}", payload)


def _path(runs: list[dict]) -> str:
    """The precision path the runs took (the CPU decides it: bf16 where it has native bf16): a
    file per path, since a machine measures only its own."""
    return "bf16" if runs[0]["precision"] == "bfloat16" else "fp32"


def _task(result: dict) -> Task:
    return TASKS[result.get("task", "images")]  # files written before text joined are the images'


def summary(runs: list[dict]) -> dict:
    accs = [r["acc1"] for r in runs]
    return {"wall_s": statistics.median(r["wall_s"] for r in runs), "mean": statistics.mean(accs), "min": min(accs)}


def figures(result: dict) -> list[dict]:
    """The comparison row: the first recipe's median wall time over the speedrun's."""
    t, recipes = _task(result), result["recipes"]
    baseline, speedrun = summary(next(iter(recipes.values()))["runs"]), summary(recipes[t.speedrun]["runs"])
    ratio = baseline["wall_s"] / speedrun["wall_s"]
    short = f"; {t.speedrun}'s mean is under the target" if speedrun["mean"] < t.target else ""
    short += f"; {t.speedrun} as it was on {result['date']}" if _stale(result, t) else ""
    return [
        {
            "ours": f"{ratio:.1f}x ({speedrun['wall_s']:.1f} s vs {baseline['wall_s']:.1f} s median wall, mean top-1 "
            f"{speedrun['mean']:.2%} vs {baseline['mean']:.2%}{short})",
            "ratio": ratio,
        }
    ]


def _reached(runs: list[dict], target: float) -> str:
    times = [t for t in (time_to(r, target) for r in runs) if t is not None]
    if len(times) < len(runs):
        return f"reached in {len(times)} of {len(runs)} runs"
    return f"{statistics.median(times):.1f} s"


def section(results: Path, task: str = "images") -> str:
    """A task's time-to-accuracy tables, one set per precision path measured, computed from the
    runs in its result files."""
    t = TASKS[task]
    paths = [p for p in (results / f"{t.result}_{path}.json" for path in PATHS) if p.is_file()]
    if not paths:
        return f"No run recorded yet: `python -m bench {t.result}` writes `bench/results/{t.result}_<path>.json` and the tables."
    return "\n\n".join(_tables(path, t) for path in paths)


def _tables(path: Path, t: Task) -> str:
    from bench.readme import machine

    result = json.loads(path.read_text())
    recipes = result["recipes"]
    baseline_name, baseline = next(iter(recipes)), summary(next(iter(recipes.values()))["runs"])
    lines = [
        f"The {path.stem.rsplit('_', 1)[1]} path, measured on {machine(result['hardware'])} by `python -m bench {t.result}` "
        f"(`bench/results/{path.name}`), fresh processes interleaved by seed:",
        "",
        f"| command | median wall time (whole command) | top-1 per seed | mean (lowest) | wall vs {baseline_name} |",
        "|---|---|---|---|---|",
    ]
    for recipe in recipes.values():
        s, runs = summary(recipe["runs"]), recipe["runs"]
        command = " ".join(["`python train.py", *recipe["overrides"]]) + "`"
        per_seed = ", ".join(f"{r['acc1']:.2%}" for r in runs)
        lines.append(
            f"| {command} | {s['wall_s']:.1f} s | {per_seed} | {s['mean']:.2%} ({s['min']:.2%}) | "
            f"{s['wall_s'] / baseline['wall_s']:.2f}x |"
        )
    changes = [line for kind, verb in CHANGES.items() for line in _changes(result, t, kind, verb)]
    if _stale(result, t):
        lines += [
            "",
            f"Measured on {result['date']} with `{t.speedrun}` as it was then (the changes below name it so); "
            f"`python -m bench {t.result}` measures today's recipe.",
        ]
    seconds = _where_seconds_go(t.speedrun, recipes[t.speedrun]["runs"])
    return "\n".join([*lines, *seconds, *changes, "", f"![top-1 against wall time](assets/{path.stem}.png)"])


def _stale(result: dict, t: Task) -> bool:
    """Whether the file's one-technique changes are not today's: the speedrun's recipe has changed
    since the file was measured, so its figures describe the recipe as it was."""
    then = {kind: {n: e["override"] for n, e in result.get(kind, {}).items()} for kind in CHANGES}
    return then != {kind: getattr(t, kind) for kind in CHANGES}


def _where_seconds_go(name: str, runs: list[dict]) -> list[str]:
    """The speedrun's wall time by part, medians over its runs: start-up phase by phase (the
    run's summary.json), the training steps, and the rest (validation, files, the process's end)."""
    if "startup_s" not in runs[0]:  # runs from before summary.json had the phases
        return []
    parts = {phase: [r["startup_s"][phase] for r in runs] for phase in runs[0]["startup_s"]}
    parts["training steps"] = [r["train_time_s"] for r in runs]
    parts["the rest (validation, saving, exit)"] = [r["wall_s"] - r["first_step_s"] - r["train_time_s"] for r in runs]
    cells = " | ".join(f"{statistics.median(v):.2f} s" for v in parts.values())
    return [
        "",
        f"Where `{name}`'s wall time goes (medians of its {len(runs)} runs; start-up from each run's `summary.json`):",
        "",
        "| " + " | ".join(parts) + " |",
        "|" + "---|" * len(parts),
        f"| {cells} |",
    ]


def _changes(result: dict, t: Task, kind: str, verb: str) -> list[str]:
    """The table of the speedrun with one technique `verb` (removed: the ablation; added: the trials)."""
    if not result.get(kind):
        return []
    speedrun, target = result["recipes"][t.speedrun]["runs"], result["target"]
    lines = [
        "",
        f"`{t.speedrun}` with one technique {verb} ({t.ablation_seeds} seeds each; the recipe's own figures are "
        f"those seeds' runs above):",
        "",
        f"| {verb} | override | median wall time | time to {target:.1%} | mean top-1 | top-1 vs {t.speedrun} |",
        "|---|---|---|---|---|---|",
    ]
    for name, entry in result[kind].items():
        runs = entry["runs"]
        base = statistics.mean(r["acc1"] for r in speedrun if r["seed"] in {a["seed"] for a in runs})
        s = summary(runs)
        lines.append(
            f"| {name} | `{entry['override']}` | {s['wall_s']:.1f} s | {_reached(runs, target)} | {s['mean']:.2%} | "
            f"{100 * (s['mean'] - base):+.2f} points |"
        )
    return lines


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
    targets = [x for x in (result["target"], result["long_target"]) if x is not None]
    for target in targets:
        ax.axhline(target, color="black", linewidth=0.6, linestyle=":")
    ax.set_ylim(min(targets) - 0.065, max(targets) + 0.02)
    ax.set_xlabel("seconds since `python train.py` started")
    ax.set_ylabel(f"validation top-1 ({_task(result).metric})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":  # python -m bench.time_to_accuracy [images|text]
    print(run(*sys.argv[1:]))
