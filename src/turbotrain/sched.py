"""Learning-rate schedules, all stepped once per optimizer step."""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import CyclicLR, LambdaLR, LRScheduler, OneCycleLR

from turbotrain.config import ConfigError


class WarmupCosine:
    """Linear warm-up over `warmup` steps, then cosine from 1 to `min_ratio` at `total`.
    A class (not a closure) so LambdaLR can save its state in a checkpoint."""

    def __init__(self, warmup: int, total: int, min_ratio: float):
        self.warmup, self.total, self.min_ratio = warmup, total, min_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        t = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * t))


class StepDecay:
    def __init__(self, every: int, gamma: float):
        self.every, self.gamma = max(1, every), gamma

    def __call__(self, step: int) -> float:
        return self.gamma ** (step // self.every)


def build_scheduler(
    optimizer: torch.optim.Optimizer, sched_cfg, optim_cfg, *, total_steps: int, steps_per_epoch: int
) -> LRScheduler | None:
    c = sched_cfg
    if c.name == "none":
        return None
    if c.name == "cosine":
        warmup = min(c.warmup_steps, max(0, total_steps - 1))
        return LambdaLR(optimizer, WarmupCosine(warmup, total_steps, c.min_lr_ratio))
    if c.name == "step":
        return LambdaLR(optimizer, StepDecay(c.step_epochs * steps_per_epoch, c.gamma))
    if c.name == "onecycle":
        return OneCycleLR(optimizer, max_lr=optim_cfg.lr, total_steps=total_steps, pct_start=c.pct_start)
    if c.name == "cyclic":
        half = max(1, int(c.cycle_epochs * steps_per_epoch / 2))
        return CyclicLR(
            optimizer,
            base_lr=optim_cfg.lr * c.base_lr_ratio,
            max_lr=c.max_lr or optim_cfg.lr,
            step_size_up=half,
            cycle_momentum=optim_cfg.name in ("sgd", "rmsprop") and optim_cfg.momentum > 0,
        )
    allowed = "none, cosine, cyclic, onecycle, step"
    raise ConfigError(f"sched.name={c.name!r} is not supported; allowed: {allowed}")
