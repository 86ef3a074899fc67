"""summary.json: a run's final figures, gathered from the Run that holds its state."""

from __future__ import annotations

import time

import torch

from turbotrain.train import resume
from turbotrain.train.tracking import peak_mem_mb


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
