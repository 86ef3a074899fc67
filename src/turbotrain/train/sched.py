"""Learning-rate schedules, all stepped once per optimizer step. Each computes the LR in closed
form from its step count, which is what lets an extended run continue its schedule (resume.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.optim.lr_scheduler import CyclicLR, LambdaLR, LRScheduler, OneCycleLR

from turbotrain.core.registry import Registry
from turbotrain.core.schema import NON_NEGATIVE, POSITIVE, UNIT_CLOSED, UNIT_OPEN, setting

SCHEDULES = Registry("sched")


@dataclass
class SchedConfig:
    name: str = "none"  # the option (sched=<name>)


@dataclass
class CosineConfig(SchedConfig):
    warmup_steps: int = setting(100, bound=NON_NEGATIVE)  # linear warm-up steps from zero
    min_lr_ratio: float = setting(0.0, bound=UNIT_CLOSED)  # the final learning rate as a share of optim.lr


@dataclass
class StepConfig(SchedConfig):
    step_epochs: int = setting(1, bound=POSITIVE)  # decay every N epochs
    gamma: float = setting(0.1, bound=POSITIVE)  # multiply the learning rate by this every step_size epochs


@dataclass
class OneCycleConfig(SchedConfig):
    pct_start: float = setting(0.3, bound=UNIT_OPEN)  # share of the steps spent rising to the peak
    anneal_strategy: str = setting("cos", choices=("cos", "linear"))  # linear: a triangle (short runs)


@dataclass
class CyclicConfig(SchedConfig):
    base_lr_ratio: float = setting(0.1, bound=UNIT_CLOSED)  # base_lr = optim.lr * ratio
    max_lr: float | None = setting(None, bound=POSITIVE)  # None: optim.lr
    cycle_epochs: float = setting(2.0, bound=POSITIVE)  # one up+down cycle


@dataclass
class Horizon:
    """What a schedule needs to know about the run: its length and the steps of one epoch."""

    total_steps: int
    steps_per_epoch: int


def build_scheduler(
    optimizer: torch.optim.Optimizer, sched_cfg, optim_cfg, *, total_steps: int, steps_per_epoch: int
) -> LRScheduler | None:
    horizon = Horizon(int(total_steps), max(1, steps_per_epoch))
    return SCHEDULES.of(sched_cfg).build(optimizer, sched_cfg, optim_cfg, horizon)


@SCHEDULES.register("none", SchedConfig)
def constant(optimizer, c, optim_cfg, horizon: Horizon) -> None:
    return None


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


@SCHEDULES.register("cosine", CosineConfig)
def cosine(optimizer, c, optim_cfg, horizon: Horizon) -> LRScheduler:
    warmup = min(c.warmup_steps, max(0, horizon.total_steps - 1))
    return LambdaLR(optimizer, WarmupCosine(warmup, horizon.total_steps, c.min_lr_ratio))


class StepDecay:
    def __init__(self, every: int, gamma: float):
        self.every, self.gamma = max(1, every), gamma

    def __call__(self, step: int) -> float:
        return self.gamma ** (step // self.every)


@SCHEDULES.register("step", StepConfig)
def step(optimizer, c, optim_cfg, horizon: Horizon) -> LRScheduler:
    return LambdaLR(optimizer, StepDecay(c.step_epochs * horizon.steps_per_epoch, c.gamma))


@SCHEDULES.register("onecycle", OneCycleConfig)
def onecycle(optimizer, c, optim_cfg, horizon: Horizon) -> LRScheduler:
    peaks = [g["lr"] for g in optimizer.param_groups]  # optim.lr, or its multiple (optim.norm_lr_scale)
    return OneCycleLR(
        optimizer, max_lr=peaks, total_steps=horizon.total_steps, pct_start=c.pct_start, anneal_strategy=c.anneal_strategy
    )


@SCHEDULES.register("cyclic", CyclicConfig)
def cyclic(optimizer, c, optim_cfg, horizon: Horizon) -> LRScheduler:
    scales = [g["lr"] / optim_cfg.lr for g in optimizer.param_groups]  # optim.norm_lr_scale's groups
    return CyclicLR(
        optimizer,
        base_lr=[optim_cfg.lr * c.base_lr_ratio * s for s in scales],
        max_lr=[(c.max_lr or optim_cfg.lr) * s for s in scales],
        step_size_up=max(1, int(c.cycle_epochs * horizon.steps_per_epoch / 2)),
        cycle_momentum=optimizer.defaults.get("momentum", 0) > 0,  # optimizers without momentum: none to cycle
    )


@dataclass
class ExponentialConfig(SchedConfig):
    gamma: float = setting(0.9, bound=(0, 1, False, True))  # LR factor per epoch, applied smoothly per step


class ExponentialDecay:
    """lr * gamma ** (step / steps_per_epoch): torch's ExponentialLR multiplies the LR it last
    set, this is closed form, so a resumed or extended run continues the same curve."""

    def __init__(self, gamma: float, steps_per_epoch: int):
        self.gamma, self.steps_per_epoch = gamma, steps_per_epoch

    def __call__(self, step: int) -> float:
        return self.gamma ** (step / self.steps_per_epoch)


@SCHEDULES.register("exponential", ExponentialConfig)
def exponential(optimizer, c, optim_cfg, horizon: Horizon) -> LRScheduler:
    return LambdaLR(optimizer, ExponentialDecay(c.gamma, horizon.steps_per_epoch))
