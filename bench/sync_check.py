"""CUDA only (bench/gpu_check.sh): training steps under `torch.cuda.set_sync_debug_mode("error")`.

A host read of a GPU value inside a step (`.item()`, a Python `if` on a tensor, a copy to the
CPU) stalls the GPU queue once per step; in sync-debug mode it raises at the line that does it.
The loop's own steps (loop.short_run: fp16 autocast and GradScaler, the fused optimizer, the
non-finite check, the meter), on a batch already on the GPU; steps 1-3 warm up (cuDNN's
choices, the scaler's first scale) and the epoch's end, which reads its counts once, runs with
the mode off again. `python -m bench.sync_check [precision]` (default amp: fp16 with GradScaler)
exits 1 naming the line of the first sync.
"""

from __future__ import annotations

import sys

import torch
from hydra import compose, initialize_config_dir
from torch.utils.data import DataLoader, TensorDataset

import turbotrain.options  # noqa: F401  (fills the option registries)
from bench.common import ROOT
from turbotrain.config import register_configs
from turbotrain.models import build_model
from turbotrain.train.loop import TrainState, short_run
from turbotrain.train.precision import build_precision


def run(precision_name: str = "amp", steps: int = 20, batch: int = 64, size: int = 64) -> None:
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        overrides = ["model=resnet18", f"precision={precision_name}", f"trainer.log_every_n_steps={steps}"]
        cfg = compose(config_name="train", overrides=overrides)
    device = torch.device("cuda")
    model = build_model(cfg.model, 10, 3).to(device, memory_format=torch.channels_last)
    x = torch.randn(steps * batch, 3, size, size, device=device)
    y = torch.randint(0, 10, (steps * batch,), device=device)
    loader = DataLoader(TensorDataset(x, y), batch_size=batch)

    def on_step(state: TrainState) -> None:
        torch.cuda.set_sync_debug_mode("error" if 3 <= state.global_step < steps - 1 else "default")

    precision = build_precision(cfg.precision, device)
    short_run(model, loader, cfg, device=device, precision=precision, batches=steps, on_step=on_step)
    print(f"sync check: no host sync in training steps 4-{steps - 1} (resnet18, precision={precision_name}, SGD)")


if __name__ == "__main__":
    run(*sys.argv[1:2])
