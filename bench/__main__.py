"""`python -m bench [name ...]`: run benchmarks (default: all), write bench/results/, update README."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bench import attention, common, overhead, prune, train_speed

ROOT = Path(__file__).resolve().parents[1]


def make_cfg(*overrides: str):
    from hydra import compose, initialize_config_dir

    from turbotrain.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=["trainer.progress_bar=false", *overrides])


BENCHES = {
    "precision": lambda: train_speed.precision_channels_last(make_cfg),
    "prune": prune.run,  # needs two trained runs: see bench/prune.py
    "attention": attention.run,
    "overhead": overhead.run,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", choices=[[], *BENCHES], help="benchmarks to run (default: all)")
    args = parser.parse_args()
    os.environ.setdefault("WANDB_MODE", "disabled")
    for name in args.names or list(BENCHES):
        path = BENCHES[name]()
        print(f"{name}: wrote {path}")
    common.update_readme()
    return 0


if __name__ == "__main__":
    sys.exit(main())
