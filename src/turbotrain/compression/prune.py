"""Pruning: structured channel pruning (torch-pruning's DepGraph) and unstructured weight pruning.

Channel pruning removes whole conv channels together with everything that depends on them
(residual adds, depthwise convs, BN, the classifier's inputs), so the result is a smaller dense
model. Its architecture is recorded as conv `groups` per layer; every other shape is read off
the state dict when the model is rebuilt (`restore`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch_pruning as tp
from torch import nn
from torch.nn.utils import prune as tprune

from turbotrain.compression.compress import COMPRESSION, CompressionConfig, Surgery
from turbotrain.core.modules import count_macs
from turbotrain.core.schema import NON_NEGATIVE, POSITIVE, UNIT_OPEN, ConfigError, setting

log = logging.getLogger("turbotrain")

IMPORTANCE = {
    "l1": lambda: tp.importance.MagnitudeImportance(p=1),  # the seed's mean |w| per output channel
    "group_l1": lambda: tp.importance.GroupMagnitudeImportance(p=1),
    "taylor": lambda: tp.importance.GroupTaylorImportance(),
}


@dataclass
class ChannelPruneConfig(CompressionConfig):
    flops_reduction: float | None = setting(0.4, bound=UNIT_OPEN)  # MACs drop by this fraction
    channel_ratio: float | None = setting(None, bound=UNIT_OPEN)  # alternative target: fraction of channels removed
    importance: str = setting("l1", choices=tuple(IMPORTANCE))  # how channels are ranked before the least important are removed
    round_to: int = setting(8, bound=NON_NEGATIVE)  # pruned channel counts are multiples of this (0: exact)
    steps: int = setting(1, bound=POSITIVE)  # iterative pruning increments
    finetune_steps: int = setting(0, bound=NON_NEGATIVE)  # optimizer steps of fine-tuning between increments


@dataclass
class WeightPruneConfig(CompressionConfig):
    sparsity: float = setting(0.5, bound=UNIT_OPEN)  # share of each layer's weights set to zero


def _classifier(model: nn.Module) -> nn.Module:
    return [m for m in model.modules() if isinstance(m, nn.Linear)][-1]


def channel_prune(model: nn.Module, example: torch.Tensor, cfg, *, grad_batch=None, finetune=None) -> dict:
    """Prune output channels until MACs drop by `cfg.flops_reduction` (or channels by
    `cfg.channel_ratio`), in `cfg.steps` increments with `finetune` between them.
    Returns what changed; raises if nothing could be pruned."""
    if cfg.flops_reduction is None and cfg.channel_ratio is None:
        raise ConfigError("compression=channel_prune needs compression.flops_reduction or compression.channel_ratio")
    if cfg.flops_reduction is not None and not 0 < cfg.flops_reduction < 1:
        raise ConfigError(f"compression.flops_reduction={cfg.flops_reduction} must be in (0, 1)")
    if cfg.channel_ratio is not None and not 0 < cfg.channel_ratio < 1:
        raise ConfigError(f"compression.channel_ratio={cfg.channel_ratio} must be in (0, 1)")
    if cfg.importance not in IMPORTANCE:
        raise ConfigError(f"compression.importance={cfg.importance!r}; allowed: {', '.join(IMPORTANCE)}")
    base_macs, base_params = count_macs(model, example), sum(p.numel() for p in model.parameters())
    shapes = {n: m.weight.shape for n, m in model.named_modules() if isinstance(m, nn.Conv2d | nn.Linear)}
    model.eval()
    fine = 100  # pruner increments: small enough to land close to a FLOPs target
    pruner = tp.pruner.MetaPruner(
        model,
        example,
        importance=IMPORTANCE[cfg.importance](),
        pruning_ratio=cfg.channel_ratio if cfg.channel_ratio is not None else 0.95,
        iterative_steps=fine if cfg.channel_ratio is None else cfg.steps,
        ignored_layers=[_classifier(model)],
        round_to=cfg.round_to or None,  # channel counts that are multiples of 8 keep oneDNN kernels fast
    )
    for k in range(1, cfg.steps + 1):
        goal = None if cfg.flops_reduction is None else base_macs * (1 - cfg.flops_reduction * k / cfg.steps)
        while True:
            if pruner.current_step >= pruner.iterative_steps:
                raise ConfigError(
                    f"compression.flops_reduction={cfg.flops_reduction}: reached only "
                    f"{1 - count_macs(model, example) / base_macs:.0%} before every prunable channel was used"
                )
            if cfg.importance == "taylor" and grad_batch is not None:
                grad_batch(model)
            pruner.step()
            if goal is None or count_macs(model, example) <= goal:
                break
        if finetune is not None and k < cfg.steps:
            finetune(model)
            model.eval()
    after_macs, after_params = count_macs(model, example), sum(p.numel() for p in model.parameters())
    if after_macs >= base_macs:
        raise ConfigError("compression=channel_prune changed nothing: no prunable conv channels found")
    model.zero_grad(set_to_none=True)
    return {
        "method": "channel_prune",
        "macs_before": base_macs,
        "macs_after": after_macs,
        "macs_reduction": 1 - after_macs / base_macs,
        "params_before": base_params,
        "params_after": after_params,
        "pruned_layers": sum(
            1 for n, m in model.named_modules() if isinstance(m, nn.Conv2d | nn.Linear) and m.weight.shape != shapes[n]
        ),
    }


def record(model: nn.Module) -> dict[str, int]:
    """What shapes in a state dict do not tell: each conv's `groups`."""
    return {name: m.groups for name, m in model.named_modules() if isinstance(m, nn.Conv2d)}


def restore(model: nn.Module, groups: dict[str, int], state_dict: dict[str, torch.Tensor]) -> None:
    """Resize an unpruned model in place to the shapes of a pruned one's state dict."""
    for name, module in model.named_modules():
        for pname, tensor in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
            new = state_dict.get(f"{name}.{pname}" if name else pname)
            if new is None or new.shape == tensor.shape:
                continue
            empty = torch.empty(new.shape, dtype=tensor.dtype)
            if isinstance(tensor, nn.Parameter):
                setattr(module, pname, nn.Parameter(empty, requires_grad=tensor.requires_grad))
            else:
                module.register_buffer(pname, empty)
        if isinstance(module, nn.Conv2d):
            module.groups = groups.get(name, module.groups)
            module.out_channels = module.weight.shape[0]
            module.in_channels = module.weight.shape[1] * module.groups
        elif isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.num_features = module.weight.shape[0] if module.weight is not None else module.num_features
        elif isinstance(module, nn.Linear):
            module.out_features, module.in_features = module.weight.shape


@COMPRESSION.register(
    "channel_prune",
    ChannelPruneConfig,
    kind="image",
    ranks_weights=True,
    structure=("conv_groups", record, restore),
    order=1,  # shapes are read off the state dict after other methods have replaced modules
)
def channel_prune_option(model: nn.Module, cfg, surgery: Surgery) -> dict:
    return channel_prune(model, surgery.example, cfg, grad_batch=surgery.grad_batch, finetune=surgery.finetune)


def _prunable(model: nn.Module) -> list[tuple[nn.Module, str]]:
    return [(m, "weight") for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear)]


@COMPRESSION.register("weight_prune", WeightPruneConfig, ranks_weights=True, reapply_on_resume=True)
def weight_prune_option(model: nn.Module, cfg, surgery: Surgery | None = None) -> dict:
    return weight_prune(model, cfg.sparsity)


def weight_prune(model: nn.Module, sparsity: float) -> dict:
    """Global L1 unstructured pruning of conv/linear weights. The masks stay on (so fine-tuning
    cannot regrow pruned weights) until `make_permanent`."""
    if not 0 < sparsity < 1:
        raise ConfigError(f"compression.sparsity={sparsity} must be in (0, 1)")
    params = _prunable(model)
    if not params:
        raise ConfigError("compression=weight_prune changed nothing: the model has no conv/linear weights")
    tprune.global_unstructured(params, pruning_method=tprune.L1Unstructured, amount=sparsity)
    return {"method": "weight_prune", "sparsity_target": sparsity, **sparsity_report(model)}


def sparsity_report(model: nn.Module) -> dict:
    layers, zeros, total = {}, 0, 0
    for name, m in model.named_modules():
        if isinstance(m, nn.Conv2d | nn.Linear):
            w = m.weight
            layers[name] = round((w == 0).float().mean().item(), 4)
            zeros += int((w == 0).sum())
            total += w.numel()
    return {"sparsity": zeros / max(total, 1), "sparsity_per_layer": layers}


def make_permanent(model: nn.Module) -> None:
    """Fold weight-pruning masks into plain weights (prune.remove); no-op without masks."""
    for m in model.modules():
        if tprune.is_pruned(m) and hasattr(m, "weight_mask"):
            tprune.remove(m, "weight")


def plain_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict as if masks were folded in (`weight`, not `weight_orig` + `weight_mask`)."""
    out = {}
    for key, value in model.state_dict().items():
        if key.endswith("weight_mask"):
            continue
        if key.endswith("weight_orig"):
            module = model.get_submodule(key.rsplit(".", 1)[0])
            out[key[: -len("_orig")]] = module.weight.detach().clone()
        else:
            out[key] = value
    return out
