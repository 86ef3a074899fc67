"""`python -m bench [name ...]`: run benchmarks (default: all), write bench/results/, update README."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bench import attention, autotune, common, inference, loader, overhead, prune, resolution, train_speed

ROOT = Path(__file__).resolve().parents[1]


def make_cfg(*overrides: str):
    from hydra import compose, initialize_config_dir

    from turbotrain.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=["trainer.progress_bar=false", *overrides])


BENCHES = {  # CPU sizes: minutes each on 2 cores
    "precision": lambda: train_speed.precision_channels_last(make_cfg),
    "text_precision": lambda: train_speed.text_precision(make_cfg),
    "inference": inference.run,
    "loader": loader.run,
    "autotune": autotune.run,
    "resolution": resolution.run,
    "prune": prune.run,  # needs two trained runs: see bench/prune.py
    "attention": attention.run,
    "overhead": overhead.run,
}

GPU_BENCHES = {  # bench/gpu_check.sh: GPU sizes, fp16 AMP + GradScaler, pinned memory; ~8 minutes in all
    "precision": lambda: train_speed.precision_channels_last(make_cfg, repeats=3, steps=20, size=224, batch=128),
    "text_precision": lambda: train_speed.text_precision(make_cfg, repeats=3, steps=10, batch=128),
    "loader": lambda: loader.run(repeats=2, batches=40, size=224, batch=128),
    "overhead": lambda: overhead.run(repeats=3, steps=150, batch=128, size=128),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", choices=[[], *BENCHES], help="benchmarks to run (default: all)")
    parser.add_argument("--gpu", action="store_true", help="GPU sizes, results in bench/results/gpu/ (README untouched)")
    args = parser.parse_args()
    os.environ.setdefault("WANDB_MODE", "disabled")
    benches = GPU_BENCHES if args.gpu else BENCHES
    if args.gpu:
        common.RESULTS = common.RESULTS / "gpu"
    for name in args.names or list(benches):
        if name not in benches:
            print(f"{name}: no {'GPU' if args.gpu else 'CPU'} version, skipped")
            continue
        path = benches[name]()
        print(f"{name}: wrote {path}")
    if not args.gpu:
        common.update_readme()
    return 0


if __name__ == "__main__":
    sys.exit(main())
