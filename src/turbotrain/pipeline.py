"""train(cfg, run_dir): the one place that fixes the order of a training run."""

from __future__ import annotations

import json
import logging
import random
import signal
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from turbotrain import checkpoint as ckpt_io
from turbotrain import distributed as dist
from turbotrain.build import Parts, build
from turbotrain.compression import prune
from turbotrain.loop import Diverged, TrainState, evaluate, train_one_epoch
from turbotrain.models import describe
from turbotrain.preemption import Preempted, StopFlag, watch_signals
from turbotrain.profiling import profiler
from turbotrain.tracking import Tracker, peak_mem_mb, process_age_s
from turbotrain.validation import validate

log = logging.getLogger("turbotrain")


class TrainingError(RuntimeError):
    """Training cannot go on (diverged); the message says where the last good checkpoint is."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_resume(resume: str | None, run_dir: Path) -> Path | None:
    if not resume:
        return None
    if resume == "auto":
        last = run_dir / "checkpoints" / "last.pt"
        if last.is_file():
            return last
        log.info("trainer.resume=auto: no %s yet, starting fresh", last)
        return None
    return Path(resume).expanduser()


def train(cfg, run_dir: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> float:
    """Run training as configured; returns the best validation top-1 (for sweepers).
    `overrides` are the command line's, handed to DDP workers when this process launches them."""
    validate(cfg)
    run_dir = Path(run_dir)
    if cfg.distributed.name == "ddp" and not dist.in_worker_env():
        dist.launch(cfg.distributed.nproc, run_dir, list(overrides), cfg.distributed.timeout_s)
        return json.loads((run_dir / "summary.json").read_text())["best_val_acc1"]
    seed_everything(cfg.trainer.seed)
    if cfg.trainer.threads:
        torch.set_num_threads(cfg.trainer.threads)
    info, device = dist.setup(cfg.distributed, cfg.trainer.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed shapes per run: let cuDNN pick its fastest kernels
    try:
        with watch_signals() as stop, profiler(cfg.profiler, run_dir, device, info.is_main) as profile_step:
            return _fit(cfg, run_dir, info, device, stop, profile_step)
    except Diverged as e:
        last = run_dir / "checkpoints" / "last.pt"
        good = f"last good checkpoint: {last}" if last.is_file() else "no checkpoint was written yet"
        raise TrainingError(
            f"training diverged: {e} (trainer.on_nan={cfg.trainer.on_nan}); {good}. "
            "Try a lower optim.lr, trainer.grad_clip, or precision=fp32"
        ) from e
    finally:
        dist.teardown(info)


def _fit(cfg, run_dir: Path, info: dist.DistInfo, device: torch.device, stop: StopFlag, profile_step=None) -> float:
    tc = cfg.trainer
    if info.is_main and (stale := ckpt_io.remove_stale_temps(run_dir / "checkpoints")):
        log.info("removed %s: partial checkpoint writes of a killed process", ", ".join(stale))
    resume_path = resolve_resume(tc.resume, run_dir)
    ckpt = ckpt_io.load(resume_path) if resume_path is not None else None
    p = build(cfg, info, device, ckpt, resume_path)
    reduce = dist.all_reduce_sum if info.enabled else None
    state, rng = TrainState(), None
    if ckpt is not None:
        ckpt_io.restore(ckpt, optimizer=p.optimizer, scheduler=p.scheduler, scaler=p.precision.scaler)
        state, rng = TrainState(**ckpt["state"]), ckpt["rng"]
        log.info("resumed from %s at epoch %d, step %d", resume_path, state.epoch, state.global_step)
    tracker = Tracker(
        run_dir,
        enabled=info.is_main,
        logger_cfg=cfg.logger,
        config=OmegaConf.to_container(cfg, resolve=True),
        progress_bar=tc.progress_bar,
    )
    config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    d = p.data
    arch = describe(cfg, d, p.model)
    metrics: dict = {}

    def save(name: str) -> None:
        if info.is_main:
            ckpt_io.atomic_save(
                ckpt_io.payload(
                    state_dict=prune.plain_state_dict(p.model),
                    optimizer=p.optimizer,
                    scheduler=p.scheduler,
                    scaler=p.precision.scaler,
                    state=state.as_dict(),
                    config_yaml=config_yaml,
                    arch=arch,
                    metrics=metrics,
                ),
                run_dir / "checkpoints" / f"{name}.pt",
            )

    first_step: list[float] = []  # process age at the first optimizer step (start-up cost)

    def on_step(s: TrainState) -> None:
        if not first_step:
            first_step.append(process_age_s())
        if profile_step is not None:
            profile_step()
        if stop.signum is not None:
            save("last")
            name = signal.Signals(stop.signum).name
            raise Preempted(
                stop.signum,
                f"stopped by {name} at step {s.global_step}; checkpoint written to {run_dir}/checkpoints/last.pt."
                f" Resume with: python train.py trainer.resume=auto hydra.run.dir={run_dir} (plus your overrides)",
            )
        if tc.checkpoint_every_n_steps and s.global_step % tc.checkpoint_every_n_steps == 0:
            save("last")

    log.info(
        "model %s: %.2fM params, %s FLOPs/sample; %d train / %d val samples; device %s x%d, precision %s",
        cfg.model.name,
        p.params / 1e6,
        f"{p.flops / 1e6:.1f}M" if p.flops else "?",
        len(d.train),
        len(d.val),
        device,
        info.world_size,
        p.precision.name if p.precision.dtype is None else f"{p.precision.name} ({p.precision.dtype})",
    )
    if rng is not None:
        ckpt_io.set_rng_state(rng)
    session = torch.zeros(3, dtype=torch.float64)  # samples (all ranks), seconds, data-wait seconds
    balance: list[list[float]] = []
    while state.epoch < tc.max_epochs and not (tc.max_steps and state.global_step >= tc.max_steps):
        p.sampler.set_epoch(state.epoch, start=state.batch_in_epoch * cfg.data.batch_size)
        p.loader_rng.manual_seed(tc.seed * 1_000_003 + state.epoch + 1)
        stats = train_one_epoch(
            p.train_model,
            p.train_loader,
            p.optimizer,
            p.scheduler,
            p.precision,
            state,
            trainer_cfg=tc,
            device=device,
            tracker=tracker,
            batches_in_epoch=p.batches_in_epoch,
            on_step=on_step,
            reduce=reduce,
            resize=p.resize,
        )
        session += torch.tensor([stats["samples"] * info.world_size, stats["time_s"], stats["wait_s"]])
        balance = dist.gather_floats([peak_mem_mb(device), stats["time_s"]], device)
        warning = dist.balance_warning(balance, ("peak_mem_mb", "epoch_time_s")) if info.enabled else None
        if warning and info.is_main:
            log.warning(warning)
        val = evaluate(
            p.train_model,
            p.val_loader,
            device=device,
            precision=p.precision,
            max_batches=tc.limit_val_batches,
            channels_last=tc.channels_last,
            reduce=reduce,
        )
        metrics = {f"val_{k}": v for k, v in val.items()}
        tracker.log(
            step=state.global_step,
            epoch=state.epoch,
            split="val",
            **{k: val[k] for k in ("loss", "acc1", "acc5")},
            lr=p.optimizer.param_groups[0]["lr"],
            samples_per_s=stats["samples_per_s"] * info.world_size,
            data_wait_frac=stats["data_wait_frac"],
            peak_mem_mb=peak_mem_mb(device),
        )
        log.info(
            "epoch %d step %d: val loss %.4f acc1 %.4f acc5 %.4f | train %.0f samples/s, data wait %.1f%%",
            state.epoch,
            state.global_step,
            val["loss"],
            val["acc1"],
            val["acc5"],
            stats["samples_per_s"] * info.world_size,
            100 * stats["data_wait_frac"],
        )
        if state.batch_in_epoch >= p.batches_in_epoch:
            state.epoch += 1
            state.batch_in_epoch = 0
        improved = val["acc1"] > state.best_val_acc1
        state.best_val_acc1 = max(state.best_val_acc1, val["acc1"])
        save("last")
        if improved:
            save("best")
    prune.make_permanent(p.model)
    tracker.summary(_summary(cfg, p, state, metrics, session, balance, first_step, device, info, run_dir))
    tracker.close()
    return state.best_val_acc1


def _summary(cfg, p: Parts, state: TrainState, metrics: dict, session, balance, first_step, device, info, run_dir: Path) -> dict:
    """summary.json: the run's final figures (DESIGN's contract)."""
    samples, seconds, wait = session.tolist()
    return {
        "best_val_acc1": state.best_val_acc1,
        **metrics,
        "epochs": state.epoch,
        "steps": state.global_step,
        "skipped_steps": state.skipped_steps,
        "bad_samples": state.bad_samples,
        "train_time_s": state.train_time_s,
        "samples_per_s": samples / seconds if seconds else None,
        "data_wait_frac": wait / seconds if seconds else None,
        "peak_mem_mb": peak_mem_mb(device),
        "time_to_first_step_s": first_step[0] if first_step else None,
        "params": p.params,
        "flops": p.flops,
        "device": str(device),
        "world_size": info.world_size,
        "rank_peak_mem_mb": [row[0] for row in balance],
        "rank_epoch_time_s": [row[1] for row in balance],
        "precision": p.precision.name,
        "compression": p.compression,
        "autotune": p.autotune,
        "num_workers": cfg.loader.num_workers,  # effective settings (after loader/trainer autotune)
        "channels_last": cfg.trainer.channels_last,
        "compile": cfg.trainer.compile,
        "torch": torch.__version__,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "best_checkpoint": str(run_dir / "checkpoints" / "best.pt"),
    }
