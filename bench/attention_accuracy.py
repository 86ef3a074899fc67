"""Does `attention=sliding_window` (attention dropout 0 by default) cost accuracy? The WordNet
recipe at data.max_length=512, sliding window against full attention (the model's attention
dropout, 0.1), two seeds each. Each run is `train.py` as a user types it.
About 15 minutes a run on 2 CPU cores.
"""

from __future__ import annotations

import statistics

from bench.common import labelled, train_py, write

RECIPE = ["experiment=wordnet_minilm", "data.max_length=512"]
CONFIGS = {
    "full attention (attention dropout 0.1)": ["attention=full"],
    "sliding_window (default: attention dropout 0)": ["attention=sliding_window"],
}


def figures(result: dict) -> list[dict]:
    """Mean top-1 over the seeds, sliding window against full attention, from the runs."""
    mean = {name: statistics.mean(r["best_val_acc1"] for r in runs) for name, runs in result["runs"].items()}
    full, sliding = (mean[name] for name in CONFIGS)
    each = "; ".join(
        f"seed {a['seed']}: {100 * b['best_val_acc1']:.2f} vs {100 * a['best_val_acc1']:.2f}"
        for a, b in zip(*result["runs"].values(), strict=True)
    )
    return [{"ours": f"{100 * sliding:.2f} vs {100 * full:.2f} ({100 * (sliding - full):+.2f} points; {each})", "ratio": None}]


def run(seeds=(0, 1)) -> str:
    runs: dict = {name: [] for name in CONFIGS}
    for name, overrides in CONFIGS.items():  # accuracy, not speed: no need to interleave
        for seed in seeds:
            _, summary = train_py(*RECIPE, *overrides, f"trainer.seed={seed}")
            runs[name].append({"seed": seed, **{k: summary[k] for k in ("best_val_acc1", "samples_per_s", "train_time_s")}})
            print(name, runs[name][-1], flush=True)
    result = {"overrides": RECIPE, "configs": CONFIGS, "runs": runs}
    what = "WordNet recipe, data.max_length=512: top-1 of sliding_window vs full attention (mean of two seeds)"
    return str(write("attention_accuracy", {**result, "rows": labelled([(what, "-")], figures(result))}))


if __name__ == "__main__":
    print(run())
