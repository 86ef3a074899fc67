"""Optimizers (built after model surgery, so they see the final parameters). SGD, Adam and AdamW
are torch's fused kernels: they skip a step flagged non-finite on the device (loop.step_unless)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from turbotrain.core.registry import Registry
from turbotrain.core.schema import NON_NEGATIVE, POSITIVE, UNIT_HALF_OPEN, setting

OPTIMIZERS = Registry("optim")


@dataclass
class OptimConfig:
    name: str = "sgd"
    lr: float = setting(0.1, bound=POSITIVE)
    weight_decay: float = setting(0.0, bound=NON_NEGATIVE)


@dataclass
class SGDConfig(OptimConfig):
    weight_decay: float = setting(5e-4, bound=NON_NEGATIVE)
    momentum: float = setting(0.9, bound=UNIT_HALF_OPEN)
    nesterov: bool = True


@dataclass
class AdamConfig(OptimConfig):
    lr: float = setting(1e-3, bound=POSITIVE)
    betas: list[float] = setting(bound=UNIT_HALF_OPEN, factory=lambda: [0.9, 0.999])
    eps: float = setting(1e-8, bound=POSITIVE)


@dataclass
class AdamWConfig(AdamConfig):
    weight_decay: float = setting(0.05, bound=NON_NEGATIVE)


@dataclass
class RMSpropConfig(OptimConfig):
    lr: float = setting(1e-3, bound=POSITIVE)
    alpha: float = setting(0.99, bound=UNIT_HALF_OPEN)
    momentum: float = setting(0.9, bound=UNIT_HALF_OPEN)
    eps: float = setting(1e-8, bound=POSITIVE)


@dataclass
class AdagradConfig(OptimConfig):
    lr: float = setting(1e-2, bound=POSITIVE)
    eps: float = setting(1e-10, bound=POSITIVE)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on weights only: norm scales/shifts and biases (ndim <= 1) are exempt."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (no_decay if p.ndim <= 1 else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, optim_cfg) -> torch.optim.Optimizer:
    return OPTIMIZERS.of(optim_cfg).build(param_groups(model, optim_cfg.weight_decay), optim_cfg)


@OPTIMIZERS.register("sgd", SGDConfig)
def sgd(groups: list[dict], c) -> torch.optim.Optimizer:
    opt = torch.optim.SGD(groups, lr=c.lr, momentum=c.momentum, nesterov=c.nesterov and c.momentum > 0, fused=True)
    if c.momentum:  # the fused kernel's first step fills fresh buffers: a first step it skips would leave them unset
        for p in (p for g in groups for p in g["params"]):
            opt.state[p]["momentum_buffer"] = torch.zeros_like(p)  # zeros then the first step give its rule, buf = grad
    return opt


@OPTIMIZERS.register("adam", AdamConfig)
def adam(groups: list[dict], c) -> torch.optim.Optimizer:
    return torch.optim.Adam(groups, lr=c.lr, betas=tuple(c.betas), eps=c.eps, fused=True)


@OPTIMIZERS.register("adamw", AdamWConfig)
def adamw(groups: list[dict], c) -> torch.optim.Optimizer:
    return torch.optim.AdamW(groups, lr=c.lr, betas=tuple(c.betas), eps=c.eps, fused=True)


@OPTIMIZERS.register("rmsprop", RMSpropConfig)
def rmsprop(groups: list[dict], c) -> torch.optim.Optimizer:
    return torch.optim.RMSprop(groups, lr=c.lr, alpha=c.alpha, eps=c.eps, momentum=c.momentum)


@OPTIMIZERS.register("adagrad", AdagradConfig)
def adagrad(groups: list[dict], c) -> torch.optim.Optimizer:
    return torch.optim.Adagrad(groups, lr=c.lr, eps=c.eps)
