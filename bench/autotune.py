"""trainer.autotune against hand-picked settings: resnet18 @64 px on Fashion-MNIST through
`python train.py`, runs alternating, per precision. Steady-state train samples/s as train.py
logs them, and the tuning time autotune spent before the first step."""

from __future__ import annotations

import statistics
from pathlib import Path

from bench.common import steady_rate, train_py, write

HAND = {
    "NCHW": ("trainer.channels_last=false",),
    "channels_last": ("trainer.channels_last=true",),
}


def figures(result: dict) -> list[dict]:
    """Per precision: autotune against the best hand-picked layout, medians over the repeats."""
    rows = []
    for precision, runs in result["results"].items():
        med = {name: statistics.median(r["samples_per_s"] for r in rs) for name, rs in runs.items()}
        best_hand = max((n for n in HAND), key=lambda n: med[n])
        chosen = [r["chosen"] for r in runs["autotune"]]
        tuning = statistics.median(r["tuning_s"] for r in runs["autotune"])
        rows.append(
            {
                "what": f"resnet18 @64px precision={precision}: trainer.autotune vs best hand-picked layout ({best_hand})",
                "seed": "tuned >= best hand-picked within noise (no peer does this)",
                "ours": f"{med['autotune'] / med[best_hand]:.2f}x ({med['autotune']:.0f} vs {med[best_hand]:.0f} samples/s; "
                f"other layout {min(med[n] for n in HAND):.0f}); chose "
                + ", ".join(f"{k}={v}" for k, v in chosen[0].items())
                + f"; {tuning:.0f} s of tuning",
                "ratio": med["autotune"] / med[best_hand],
            }
        )
    return rows


def run(precisions=("fp32", "amp"), batches: int = 80, repeats: int = 2) -> Path:
    common = (
        "experiment=resnet18_fashion",
        "trainer.max_epochs=1",
        f"trainer.limit_train_batches={batches}",
        "trainer.limit_val_batches=1",
        "trainer.log_every_n_steps=5",
    )
    results: dict = {}
    for precision in precisions:
        settings = {**{k: (*v, f"precision={precision}") for k, v in HAND.items()}}
        settings["autotune"] = (f"precision={precision}", "trainer.autotune=true")
        runs: dict[str, list[dict]] = {name: [] for name in settings}
        for _ in range(repeats):
            for name, overrides in settings.items():
                events, summary = train_py(*common, *overrides)
                tuned = summary.get("autotune") or {}
                runs[name].append(
                    {"samples_per_s": steady_rate(events), "tuning_s": tuned.get("seconds"), "chosen": tuned.get("chosen")}
                )
        results[precision] = runs
    rows = figures({"results": results})
    return write("autotune", {"setup": common, "results": results, "rows": rows})


if __name__ == "__main__":
    print(run())
