"""Low-rank factorization of embeddings and Linear layers by truncated SVD.

W (V x d) ~= (U_r S_r)(V_r^T): an Embedding(V, r) followed by a Linear(r, d) without bias, both
initialized from the decomposition, so at full rank the product equals W exactly. The rank is
`compression.rank`, or the smallest keeping `compression.energy` of the squared singular values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from turbotrain.compression.compress import COMPRESSION, CompressionConfig, Surgery
from turbotrain.core.modules import replace_module
from turbotrain.core.schema import POSITIVE, UNIT_OPEN, ConfigError, setting


@dataclass
class EmbedLowRankConfig(CompressionConfig):
    targets: str = setting("embedding", choices=("embedding", "linear", "both"))  # which embedding tables to factorize
    rank: int | None = setting(128, bound=POSITIVE)  # a fixed rank instead of energy
    energy: float | None = setting(  # keep the smallest rank that holds this share of the singular values' energy
        None, bound=UNIT_OPEN
    )  # alternative: smallest rank keeping this share of squared singular values


def svd_rank(s: torch.Tensor, rank: int | None, energy: float | None) -> int:
    """`rank` (at most full), else the smallest rank keeping `energy` of the squared singular values."""
    if rank:
        return min(rank, len(s))
    if energy:
        cum = (s**2).cumsum(0) / (s**2).sum()
        return int((cum < energy).sum()) + 1
    raise ConfigError("compression.rank or compression.energy must be set for low-rank factorization")


class LowRankEmbedding(nn.Sequential):
    def __init__(self, num: int, rank: int, dim: int, padding_idx: int | None = None):
        super().__init__(nn.Embedding(num, rank, padding_idx=padding_idx), nn.Linear(rank, dim, bias=False))


class LowRankLinear(nn.Sequential):
    def __init__(self, fin: int, rank: int, fout: int, bias: bool):
        super().__init__(nn.Linear(fin, rank, bias=False), nn.Linear(rank, fout, bias=bias))


@torch.no_grad()
def factorize(model: nn.Module, targets: str, rank: int | None, energy: float | None) -> dict:
    """Factorize word embeddings (`targets` embedding|both) and Linear layers (linear|both).
    Returns {module name: rank} and param counts; raises if nothing was factorized."""
    spec, before = {}, sum(p.numel() for p in model.parameters())
    if targets in ("embedding", "both"):
        emb = model.get_input_embeddings()
        name = next(n for n, m in model.named_modules() if m is emb)
        u, s, vh = torch.linalg.svd(emb.weight.float(), full_matrices=False)
        r = svd_rank(s, rank, energy)
        new = LowRankEmbedding(emb.num_embeddings, r, emb.embedding_dim, emb.padding_idx)
        new[0].weight.copy_(u[:, :r] * s[:r])
        new[1].weight.copy_(vh[:r].T)
        replace_module(model, name, new)
        spec[name] = r
    if targets in ("linear", "both"):
        for name, m in list(model.named_modules()):
            if not isinstance(m, nn.Linear) or "classifier" in name or isinstance(m, LowRankLinear):
                continue
            u, s, vh = torch.linalg.svd(m.weight.float(), full_matrices=False)
            r = svd_rank(s, rank, energy)
            if r * (m.in_features + m.out_features) >= m.in_features * m.out_features:
                continue  # would not save parameters
            new = LowRankLinear(m.in_features, r, m.out_features, m.bias is not None)
            new[0].weight.copy_(vh[:r])
            new[1].weight.copy_(u[:, :r] * s[:r])
            if m.bias is not None:
                new[1].bias.copy_(m.bias)
            replace_module(model, name, new)
            spec[name] = r
    if not spec:
        raise ConfigError(f"compression=lowrank (targets={targets}) changed nothing: rank too high to save parameters")
    after = sum(p.numel() for p in model.parameters())
    return {"method": "lowrank", "ranks": spec, "params_before": before, "params_after": after}


def restore(model: nn.Module, spec: dict[str, int], state_dict: dict | None = None) -> None:
    """Give a fresh model the factorized modules of `spec` (weights come from a checkpoint)."""
    for name, r in spec.items():
        m = model.get_submodule(name)
        if isinstance(m, nn.Embedding):
            replace_module(model, name, LowRankEmbedding(m.num_embeddings, r, m.embedding_dim, m.padding_idx))
        else:
            replace_module(model, name, LowRankLinear(m.in_features, r, m.out_features, m.bias is not None))


def record(model: nn.Module) -> dict[str, int]:
    """{module name: rank} of the factorized modules in `model` (what `restore` needs)."""
    return {
        name: m[0].embedding_dim if isinstance(m, LowRankEmbedding) else m[0].out_features
        for name, m in model.named_modules()
        if isinstance(m, LowRankEmbedding | LowRankLinear)
    }


@COMPRESSION.register("embed_lowrank", EmbedLowRankConfig, kind="text", structure=("lowrank", record, restore))
def embed_lowrank(model: nn.Module, cfg, surgery: Surgery) -> dict:
    return factorize(model, cfg.targets, cfg.rank, cfg.energy)
