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
    # the weights of normalization layers, and every bias (a norm layer's bias is a bias);
    # None: weight_decay. 0 by default: decaying them shrinks what the weight decay of the
    # next layer already regularizes, and torchvision's recipes turn it off too
    norm_weight_decay: float | None = setting(0.0, bound=NON_NEGATIVE)
    bias_weight_decay: float | None = setting(0.0, bound=NON_NEGATIVE)


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


NORMS = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm, nn.RMSNorm)


def param_groups(model: nn.Module, optim_cfg) -> list[dict]:
    """One group per weight-decay value, in the order the kinds first appear: biases get
    `bias_weight_decay`, the other parameters of normalization layers `norm_weight_decay`, the
    rest `weight_decay`. Built from the module tree as it is (after pruning), so a rebuilt
    optimizer, at a resume, has the same groups."""
    wd = optim_cfg.weight_decay
    norm_wd, bias_wd = (wd if v is None else v for v in (optim_cfg.norm_weight_decay, optim_cfg.bias_weight_decay))
    groups: dict[float, list[nn.Parameter]] = {}
    seen: set[int] = set()  # a tied parameter (shared embeddings) is listed once
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                decay = bias_wd if name == "bias" else norm_wd if isinstance(module, NORMS) else wd
                groups.setdefault(decay, []).append(p)
    return [{"params": params, "weight_decay": decay} for decay, params in groups.items()]


def build_optimizer(model: nn.Module, optim_cfg) -> torch.optim.Optimizer:
    return OPTIMIZERS.of(optim_cfg).build(param_groups(model, optim_cfg), optim_cfg)


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
