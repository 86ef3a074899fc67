"""Optimizers (built after model surgery, so they see the final parameters). Adam, AdamW and
Adagrad are torch's fused kernels, SGD too on CUDA: they skip a step flagged non-finite on the
device (loop.step_unless). RMSprop has no fused kernel: its skip reads the flag on the host.
On a CPU, SGD takes the faster of its fused and foreach kernels, timed on the model's own
parameters at start (which one wins depends on the CPU); a run records the one it took and a
resume keeps it (numerics.py), since the two can differ in the last bit."""

from __future__ import annotations

import functools
import logging
import statistics
import time
from dataclasses import dataclass

import torch
from torch import nn

from turbotrain.core.registry import Registry
from turbotrain.core.schema import NON_NEGATIVE, POSITIVE, UNIT_HALF_OPEN, setting

OPTIMIZERS = Registry("optim")
log = logging.getLogger("turbotrain")


@dataclass
class OptimConfig:
    name: str = "sgd"  # the option (optim=<name>)
    lr: float = setting(0.1, bound=POSITIVE)  # peak learning rate (the schedule scales it)
    weight_decay: float = setting(0.0, bound=NON_NEGATIVE)  # L2 penalty (decoupled for adamw)
    # the weights of normalization layers, and every bias (a norm layer's bias is a bias);
    # None: weight_decay. 0 by default: decaying them shrinks what the weight decay of the
    # next layer already regularizes, and torchvision's recipes turn it off too
    norm_weight_decay: float | None = setting(0.0, bound=NON_NEGATIVE)
    bias_weight_decay: float | None = setting(0.0, bound=NON_NEGATIVE)  # weight decay of every bias; null: weight_decay
    # learning rate of normalization layers' weights and biases, as a multiple of lr (airbench
    # scales BatchNorm's by 64: they recover faster than the convolutions they normalize); every
    # schedule scales it as it scales lr
    norm_lr_scale: float = setting(1.0, bound=POSITIVE)


@dataclass
class SGDConfig(OptimConfig):
    weight_decay: float = setting(5e-4, bound=NON_NEGATIVE)
    momentum: float = setting(0.9, bound=UNIT_HALF_OPEN)  # momentum factor
    nesterov: bool = True  # Nesterov momentum
    # fused: one kernel per step, which takes the skip flag on the device (no host sync);
    # foreach: torch's default. auto: fused on CUDA; on a CPU the faster of the two, timed at
    # start. On AVX2 and AVX-512 the two round a vector's tail differently (the last bit of some
    # weights), so the run's effective config records the one taken and a resume keeps it
    kernel: str = setting("auto", choices=("auto", "fused", "foreach"), numeric=True)


@dataclass
class AdamConfig(OptimConfig):
    lr: float = setting(1e-3, bound=POSITIVE)
    # decay rates of the first and second moment estimates
    betas: list[float] = setting(bound=UNIT_HALF_OPEN, factory=lambda: [0.9, 0.999])
    eps: float = setting(1e-8, bound=POSITIVE)  # added to the denominator for stability


@dataclass
class AdamWConfig(AdamConfig):
    weight_decay: float = setting(0.05, bound=NON_NEGATIVE)


@dataclass
class RMSpropConfig(OptimConfig):
    lr: float = setting(1e-3, bound=POSITIVE)
    alpha: float = setting(0.99, bound=UNIT_HALF_OPEN)  # smoothing constant of the squared-gradient average
    momentum: float = setting(0.9, bound=UNIT_HALF_OPEN)  # momentum factor
    eps: float = setting(1e-8, bound=POSITIVE)  # added to the denominator for stability


@dataclass
class AdagradConfig(OptimConfig):
    lr: float = setting(1e-2, bound=POSITIVE)
    eps: float = setting(1e-10, bound=POSITIVE)  # added to the denominator for stability


NORMS = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm, nn.RMSNorm)


def param_groups(model: nn.Module, optim_cfg) -> list[dict]:
    """One group per (weight decay, learning rate), in the order the kinds first appear: biases get
    `bias_weight_decay`, the other parameters of normalization layers `norm_weight_decay`, the
    rest `weight_decay`; normalization layers' parameters learn at `lr * norm_lr_scale`. Built
    from the module tree as it is (after pruning), so a rebuilt optimizer, at a resume, has the
    same groups."""
    wd, lr = optim_cfg.weight_decay, optim_cfg.lr
    norm_wd, bias_wd = (wd if v is None else v for v in (optim_cfg.norm_weight_decay, optim_cfg.bias_weight_decay))
    groups: dict[tuple[float, float], list[nn.Parameter]] = {}
    seen: set[int] = set()  # a tied parameter (shared embeddings) is listed once
    for module in model.modules():
        norm = isinstance(module, NORMS)
        for name, p in module.named_parameters(recurse=False):
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                decay = bias_wd if name == "bias" else norm_wd if norm else wd
                groups.setdefault((decay, lr * optim_cfg.norm_lr_scale if norm else lr), []).append(p)
    return [{"params": params, "weight_decay": decay, "lr": rate} for (decay, rate), params in groups.items()]


def build_optimizer(model: nn.Module, optim_cfg) -> torch.optim.Optimizer:
    return OPTIMIZERS.of(optim_cfg).build(param_groups(model, optim_cfg), optim_cfg)


@OPTIMIZERS.register("sgd", SGDConfig)
def sgd(groups: list[dict], c) -> torch.optim.Optimizer:
    fused = _sgd_fused(groups, c)
    opt = _sgd(groups, c, fused)
    if c.momentum:  # the fused kernel's first step fills fresh buffers: a first step it skips would leave them unset
        for p in (p for g in groups for p in g["params"]):
            opt.state[p]["momentum_buffer"] = torch.zeros_like(p)  # zeros then the first step give its rule, buf = grad
    return opt


def _sgd(groups: list[dict], c, fused: bool) -> torch.optim.SGD:
    nesterov = c.nesterov and c.momentum > 0
    return torch.optim.SGD(groups, lr=c.lr, momentum=c.momentum, nesterov=nesterov, fused=fused, foreach=not fused)


def _sgd_fused(groups: list[dict], c) -> bool:
    params = [p for g in groups for p in g["params"]]
    return (auto_kernel(params, c) if c.kernel == "auto" else c.kernel) == "fused"


def auto_kernel(params: list[torch.Tensor], c, device: torch.device | None = None) -> str:
    """What optim.kernel=auto takes for these parameters on `device` (default: theirs): fused off
    the CPU, without timing (foreach would read the skip flag on the host each step), else the
    faster of the two, timed here."""
    device = device or (params[0].device if params else torch.device("cpu"))
    if not params or device.type != "cpu":
        return "fused"
    return "fused" if _fused_faster(tuple(tuple(p.shape) for p in params), c.momentum, c.nesterov) else "foreach"


@functools.cache  # once per process and set of shapes: autotune trials and pruning rebuild optimizers
def _fused_faster(shapes: tuple, momentum: float, nesterov: bool, rounds: int = 3, steps: int = 3) -> bool:
    """Times SGD's two CPU kernels on parameters of these shapes, interleaved (median of rounds).
    Measured per resnet18 step: fused 15.8 ms vs foreach 10.4 ms on an AVX-512/AMX Xeon; on an AMD
    EPYC the fused kernel took half the time of foreach."""
    params = [torch.zeros(shape, requires_grad=True) for shape in shapes]
    for p in params:
        p.grad = torch.zeros_like(p)
    c = SGDConfig(lr=0.1, momentum=momentum, nesterov=nesterov)
    optimizers = {fused: _sgd([{"params": params, "weight_decay": 5e-4}], c, fused) for fused in (True, False)}
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(rounds + 1):  # the first round warms up
        for fused, opt in optimizers.items():
            start = time.perf_counter()
            for _ in range(steps):
                opt.step()
            times[fused].append(time.perf_counter() - start)
    fused_ms, foreach_ms = (statistics.median(times[f][1:]) / steps * 1e3 for f in (True, False))
    log.info("optim.kernel=auto: SGD's fused kernel %.2f ms, foreach %.2f ms per step here", fused_ms, foreach_ms)
    return fused_ms <= foreach_ms


@OPTIMIZERS.register("adam", AdamConfig)
def adam(groups: list[dict], c) -> torch.optim.Optimizer:
    return torch.optim.Adam(groups, lr=c.lr, betas=tuple(c.betas), eps=c.eps, fused=True)


@OPTIMIZERS.register("adamw", AdamWConfig)
def adamw(groups: list[dict], c) -> torch.optim.Optimizer:
    return torch.optim.AdamW(groups, lr=c.lr, betas=tuple(c.betas), eps=c.eps, fused=True)


@OPTIMIZERS.register("rmsprop", RMSpropConfig)
def rmsprop(groups: list[dict], c) -> torch.optim.Optimizer:
    if any(p.device.type != "cpu" for g in groups for p in g["params"]):
        log.warning("optim=rmsprop has no fused kernel: skipping a non-finite step reads the device every step")
    return torch.optim.RMSprop(groups, lr=c.lr, alpha=c.alpha, eps=c.eps, momentum=c.momentum)


@OPTIMIZERS.register("adagrad", AdagradConfig)
def adagrad(groups: list[dict], c) -> torch.optim.Optimizer:
    return torch.optim.Adagrad(groups, lr=c.lr, eps=c.eps, fused=True)
