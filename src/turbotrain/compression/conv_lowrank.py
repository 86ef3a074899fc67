"""compression=conv_lowrank: each Conv2d kernel factorized by truncated SVD into two thin convs,
the CNN counterpart of embed_lowrank.

A conv's weight W [out, in, kh, kw], read as a matrix [out, in*kh*kw], is U S V^T. The first conv
keeps the kernel size, stride, padding and dilation and maps `in` channels to `r`
(weights V_r^T); the second is a 1x1 conv from `r` to `out` (weights U_r S_r, the original bias).
At full rank (r = min(out, in*kh*kw)) the pair computes exactly the original conv. A layer is
factorized only when its rank saves parameters (and so multiply-accumulates); depthwise and
grouped convs are left alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from turbotrain.compression.compress import COMPRESSION, CompressionConfig, Surgery
from turbotrain.compression.lowrank import svd_rank
from turbotrain.core.modules import count_macs, replace_module
from turbotrain.core.schema import POSITIVE, UNIT_OPEN, ConfigError, setting


@dataclass
class ConvLowRankConfig(CompressionConfig):
    rank_ratio: float | None = setting(0.25, bound=(0, 1, False, True))  # rank per layer: this share of its full rank
    energy: float | None = setting(None, bound=UNIT_OPEN)  # instead: smallest rank keeping this share of squared singular values
    rank: int | None = setting(None, bound=POSITIVE)  # at most this rank in any layer


class LowRankConv2d(nn.Sequential):
    def __init__(self, conv: nn.Conv2d, rank: int):
        thin = nn.Conv2d(conv.in_channels, rank, conv.kernel_size, conv.stride, conv.padding, conv.dilation, bias=False)
        super().__init__(thin, nn.Conv2d(rank, conv.out_channels, 1, bias=conv.bias is not None))


@torch.no_grad()
def factorize_conv(conv: nn.Conv2d, rank: int, svd: tuple | None = None) -> LowRankConv2d:
    """The two thin convs of `conv` at `rank` (its weight's SVD: given, or computed here)."""
    out = conv.out_channels
    u, s, vh = svd or torch.linalg.svd(conv.weight.reshape(out, -1).float(), full_matrices=False)
    new = LowRankConv2d(conv, rank).to(conv.weight.dtype)
    new[0].weight.copy_(vh[:rank].reshape(rank, *conv.weight.shape[1:]))
    new[1].weight.copy_((u[:, :rank] * s[:rank]).reshape(out, rank, 1, 1))
    if conv.bias is not None:
        new[1].bias.copy_(conv.bias)
    return new


def _factorizable(m: nn.Module) -> bool:
    return type(m) is nn.Conv2d and m.groups == 1 and m.padding_mode == "zeros"


def _layer_rank(s: torch.Tensor, cfg) -> int:
    if cfg.energy is not None:
        r = svd_rank(s, None, cfg.energy)
    elif cfg.rank_ratio is not None:
        r = max(1, math.ceil(cfg.rank_ratio * len(s)))
    else:
        r = len(s)
    return min(r, cfg.rank) if cfg.rank else r


@torch.no_grad()
def factorize_convs(model: nn.Module, cfg) -> dict:
    """Replace every factorizable conv whose rank saves parameters; returns the ranks and counts."""
    ranks, before = {}, sum(p.numel() for p in model.parameters())
    for name, conv in list(model.named_modules()):
        if not _factorizable(conv):
            continue
        out, fan_in = conv.out_channels, conv.weight[0].numel()
        u, s, vh = torch.linalg.svd(conv.weight.reshape(out, fan_in).float(), full_matrices=False)
        r = _layer_rank(s, cfg)
        if r * (fan_in + out) >= out * fan_in:
            continue  # two thin convs would be no smaller than the one
        replace_module(model, name, factorize_conv(conv, r, (u, s, vh)))
        ranks[name] = r
    if not ranks:
        raise ConfigError("compression=conv_lowrank changed nothing: no conv's rank would save parameters (lower rank_ratio)")
    after = sum(p.numel() for p in model.parameters())
    return {"method": "conv_lowrank", "ranks": ranks, "params_before": before, "params_after": after}


def record(model: nn.Module) -> dict[str, int]:
    """{module name: rank} of the factorized convs (what `restore` needs)."""
    return {name: m[0].out_channels for name, m in model.named_modules() if isinstance(m, LowRankConv2d)}


def restore(model: nn.Module, ranks: dict[str, int], state_dict: dict | None = None) -> None:
    """Give a fresh model the factorized convs of `ranks` (weights come from a checkpoint)."""
    for name, r in ranks.items():
        replace_module(model, name, LowRankConv2d(model.get_submodule(name), r))


@COMPRESSION.register("conv_lowrank", ConvLowRankConfig, kind="image", structure=("conv_lowrank", record, restore))
def conv_lowrank(model: nn.Module, cfg, surgery: Surgery) -> dict:
    was = count_macs(model, surgery.example)
    report = factorize_convs(model, cfg)
    now = count_macs(model, surgery.example)
    return {**report, "macs_before": was, "macs_after": now, "macs_reduction": 1 - now / was}
