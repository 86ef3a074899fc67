"""summary.json: a run's final figures, gathered from the Run that holds its state."""

from __future__ import annotations

import time

import torch

from turbotrain.train import resume
from turbotrain.train.tracking import peak_mem_mb


def startup_phases(ended_at: dict[str, float], first_step_s: float | None) -> dict[str, float]:
    """Seconds each part of start-up took, from the process's age as each ended: up to the
    first optimizer step (its batch, its kernels), the last part."""
    if first_step_s is not None:
        ended_at = {**ended_at, "first step (its batch, kernels)": first_step_s}
    ages = list(ended_at.values())
    return {name: round(age - before, 3) for name, age, before in zip(ended_at, ages, [0.0, *ages], strict=False)}


def summary_of(run) -> dict:
    cfg, p, state = run.cfg, run.p, run.state
    samples, seconds, wait = run.session.tolist()
    return {
        "best_val_acc1": state.best_val_acc1,
        "parent": state.parent,
        **run.metrics,
        "epochs": state.epoch,
        "steps": state.global_step,
        "skipped_steps": state.skipped_steps,
        "bad_samples": state.bad_samples,
        "bad_samples_indexed": p.data.bad_indexed,
        "train_time_s": state.train_time_s,
        "samples_per_s": samples / seconds if seconds else None,
        "data_wait_frac": wait / seconds if seconds else None,
        "peak_mem_mb": peak_mem_mb(run.device),
        "time_to_first_step_s": run.first_step_s,
        "startup_s": startup_phases(p.startup, run.first_step_s),
        "params": p.params,
        "flops": p.flops,
        "device": str(run.device),
        "threads": torch.get_num_threads(),
        "world_size": run.info.world_size,
        "restarts": resume.restarts(),
        "rank_peak_mem_mb": [row[0] for row in run.balance],
        "rank_epoch_time_s": [row[1] for row in run.balance],
        "precision": p.precision.name,
        "autocast_dtype": None if p.precision.dtype is None else str(p.precision.dtype).removeprefix("torch."),
        "compression": p.compression,
        "autotune": p.autotune,
        "num_workers": cfg.loader.num_workers,  # effective settings (after loader/trainer autotune)
        "channels_last": cfg.trainer.channels_last,
        "compile": cfg.trainer.compile,
        "torch": torch.__version__,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "best_checkpoint": str(run.ckpt_dir / "best.pt"),
    }
