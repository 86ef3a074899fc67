"""Optimizers (built after model surgery, so they see the final parameters)."""

from __future__ import annotations

import torch
from torch import nn

from turbotrain.config import ConfigError


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
    c = optim_cfg
    groups = param_groups(model, c.weight_decay)
    if c.name == "sgd":
        return torch.optim.SGD(groups, lr=c.lr, momentum=c.momentum, nesterov=c.nesterov and c.momentum > 0)
    if c.name == "adam":
        return torch.optim.Adam(groups, lr=c.lr, betas=tuple(c.betas), eps=c.eps)
    if c.name == "adamw":
        return torch.optim.AdamW(groups, lr=c.lr, betas=tuple(c.betas), eps=c.eps)
    if c.name == "rmsprop":
        return torch.optim.RMSprop(groups, lr=c.lr, alpha=c.alpha, eps=c.eps, momentum=c.momentum)
    if c.name == "adagrad":
        return torch.optim.Adagrad(groups, lr=c.lr, eps=c.eps)
    raise ConfigError(f"optim.name={c.name!r} is not supported; allowed: sgd, adam, adamw, rmsprop, adagrad")
