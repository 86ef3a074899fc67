"""train(cfg, run_dir): the one place that fixes the order of a training run."""

from __future__ import annotations

import logging
import math
import random
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from turbotrain import checkpoint as ckpt_io
from turbotrain.config import ConfigError, validate
from turbotrain.data import build_data
from turbotrain.data.loader import EpochSampler, build_loader
from turbotrain.loop import TrainState, evaluate, train_one_epoch
from turbotrain.models import build_model
from turbotrain.optim import build_optimizer
from turbotrain.precision import build_precision
from turbotrain.sched import build_scheduler
from turbotrain.tracking import Tracker, peak_mem_mb

log = logging.getLogger("turbotrain")


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"trainer.device={name}: CUDA is not available here; use auto or cpu")
    return device


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under DDP and/or torch.compile wrappers."""
    model = getattr(model, "module", model)
    return getattr(model, "_orig_mod", model)


def count_flops(model: nn.Module, sample: torch.Tensor) -> int | None:
    """Forward FLOPs of one sample (torch's own counter; None where it cannot run)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(sample.unsqueeze(0))
        return int(counter.get_total_flops())
    except Exception:  # exotic ops: FLOPs are informative only
        return None
    finally:
        model.train(was_training)


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


def train(cfg, run_dir: str | Path) -> float:
    """Run training as configured; returns the best validation top-1 (for sweepers)."""
    validate(cfg)
    run_dir = Path(run_dir)
    tc = cfg.trainer
    # 1. seed, distributed, device
    seed_everything(tc.seed)
    if tc.threads:
        torch.set_num_threads(tc.threads)
    device = pick_device(tc.device)
    rank, world_size = 0, 1
    is_main = rank == 0
    # 2. data
    data = build_data(cfg.data)
    # 3. model (+ surgery, once those groups have options beyond none/full)
    model = build_model(cfg.model, data.num_classes, data.in_channels)
    params = sum(p.numel() for p in model.parameters())
    flops = count_flops(model, data.val[0][0])
    # 4. device, memory format, compile, optimizer, scheduler
    model.to(device)
    if tc.channels_last:
        model.to(memory_format=torch.channels_last)
    train_model = torch.compile(model) if tc.compile else model
    precision = build_precision(cfg.precision, device)
    sampler = EpochSampler(len(data.train), tc.seed, rank=rank, world_size=world_size)
    loader_rng = torch.Generator()
    train_loader = build_loader(
        data.train,
        batch_size=cfg.data.batch_size,
        sampler=sampler,
        loader_cfg=cfg.loader,
        device=device,
        train=True,
        generator=loader_rng,
    )
    val_loader = build_loader(
        data.val,
        batch_size=cfg.data.eval_batch_size or 2 * cfg.data.batch_size,
        sampler=None,
        loader_cfg=cfg.loader,
        device=device,
        train=False,
    )
    full_batches = len(sampler) // cfg.data.batch_size
    if full_batches == 0:
        raise ConfigError(
            f"data.batch_size={cfg.data.batch_size} is larger than the training set "
            f"({len(data.train)} samples): lower it"
        )
    batches_in_epoch = min(full_batches, tc.limit_train_batches or full_batches)
    steps_per_epoch = math.ceil(batches_in_epoch / tc.grad_accum_steps)
    total_steps = tc.max_epochs * steps_per_epoch
    if tc.max_steps:
        total_steps = min(total_steps, tc.max_steps)
    optimizer = build_optimizer(model, cfg.optim)
    scheduler = build_scheduler(
        optimizer, cfg.sched, cfg.optim, total_steps=total_steps, steps_per_epoch=steps_per_epoch
    )
    state = TrainState()
    config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    arch = {
        "kind": data.kind,
        "model": OmegaConf.to_container(cfg.model, resolve=True),
        "num_classes": data.num_classes,
        "in_channels": data.in_channels,
        "image_size": data.image_size,
        "mean": data.mean,
        "std": data.std,
        "class_names": data.class_names,
    }
    resume_path = resolve_resume(tc.resume, run_dir)
    rng = None
    if resume_path is not None:
        ckpt = ckpt_io.load(resume_path)
        ckpt_io.load_model_state(model, ckpt["model"], resume_path)
        optimizer.load_state_dict(ckpt["optimizer"])
        if scheduler is not None and ckpt["scheduler"] is not None:
            scheduler.load_state_dict(ckpt["scheduler"])
        if precision.scaler is not None and ckpt["scaler"] is not None:
            precision.scaler.load_state_dict(ckpt["scaler"])
        state = TrainState(**ckpt["state"])
        rng = ckpt["rng"]
        log.info("resumed from %s at epoch %d, step %d", resume_path, state.epoch, state.global_step)
    tracker = Tracker(
        run_dir,
        enabled=is_main,
        logger_cfg=cfg.logger,
        config=OmegaConf.to_container(cfg, resolve=True),
        progress_bar=tc.progress_bar,
    )
    ckpt_dir = run_dir / "checkpoints"
    metrics: dict = {}

    def save(name: str) -> None:
        if not is_main:
            return
        ckpt_io.atomic_save(
            {
                "format": ckpt_io.FORMAT,
                "model": unwrap(model).state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict() if scheduler is not None else None,
                "scaler": precision.scaler.state_dict() if precision.scaler is not None else None,
                "state": state.as_dict(),
                "rng": ckpt_io.rng_state(),
                "config": config_yaml,
                "arch": arch,
                "metrics": metrics,
            },
            ckpt_dir / f"{name}.pt",
        )

    def on_step(s: TrainState) -> None:
        every = tc.checkpoint_every_n_steps
        if every and s.global_step % every == 0:
            save("last")

    log.info(
        "model %s: %.2fM params, %s FLOPs/sample; %d train / %d val samples; device %s, precision %s",
        cfg.model.name,
        params / 1e6,
        f"{flops / 1e6:.1f}M" if flops else "?",
        len(data.train),
        len(data.val),
        device,
        precision.name if precision.dtype is None else f"{precision.name} ({precision.dtype})",
    )
    # 5. loop
    if rng is not None:
        ckpt_io.set_rng_state(rng)
    session_samples, session_time, session_wait = 0, 0.0, 0.0
    while state.epoch < tc.max_epochs:
        if tc.max_steps and state.global_step >= tc.max_steps:
            break
        sampler.set_epoch(state.epoch, start=state.batch_in_epoch * cfg.data.batch_size)
        loader_rng.manual_seed(tc.seed * 1_000_003 + state.epoch + 1)
        stats = train_one_epoch(
            train_model,
            train_loader,
            optimizer,
            scheduler,
            precision,
            state,
            trainer_cfg=tc,
            device=device,
            tracker=tracker,
            batches_in_epoch=batches_in_epoch,
            on_step=on_step,
        )
        session_samples += stats["samples"]
        session_time += stats["time_s"]
        session_wait += stats["data_wait_frac"] * stats["time_s"]
        val = evaluate(
            train_model,
            val_loader,
            device=device,
            precision=precision,
            max_batches=tc.limit_val_batches,
            channels_last=tc.channels_last,
        )
        epoch_done = state.batch_in_epoch >= batches_in_epoch
        metrics = {f"val_{k}": v for k, v in val.items()}
        tracker.log(
            step=state.global_step,
            epoch=state.epoch,
            split="val",
            loss=val["loss"],
            acc1=val["acc1"],
            acc5=val["acc5"],
            lr=optimizer.param_groups[0]["lr"],
            samples_per_s=stats["samples_per_s"],
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
            stats["samples_per_s"],
            100 * stats["data_wait_frac"],
        )
        if epoch_done:
            state.epoch += 1
            state.batch_in_epoch = 0
        improved = val["acc1"] > state.best_val_acc1
        if improved:
            state.best_val_acc1 = val["acc1"]
        save("last")
        if improved:
            save("best")
    # 6. final figures
    summary = {
        "best_val_acc1": state.best_val_acc1,
        **metrics,
        "epochs": state.epoch,
        "steps": state.global_step,
        "skipped_steps": state.skipped_steps,
        "train_time_s": state.train_time_s,
        "samples_per_s": session_samples / session_time if session_time else None,
        "data_wait_frac": session_wait / session_time if session_time else None,
        "peak_mem_mb": peak_mem_mb(device),
        "params": params,
        "flops": flops,
        "device": str(device),
        "precision": precision.name,
        "torch": torch.__version__,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "best_checkpoint": str(ckpt_dir / "best.pt"),
    }
    tracker.summary(summary)
    tracker.close()
    return state.best_val_acc1
