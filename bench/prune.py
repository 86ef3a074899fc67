"""Compression: FLOPs, accuracy and batch-32 CPU latency of a run against its compressed run
(`prune`: channel_prune; `conv_lowrank`: the conv factorization).

Reads runs of the recipes bench (`python -m bench.recipes resnet18_fashion resnet18_pruned
resnet18_conv_lowrank`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

import turbotrain.options  # noqa: F401  (fills the option registries)
from bench.common import write
from bench.recipes import ROOT, RUNS
from turbotrain.core.checkpoint import load
from turbotrain.core.modules import count_macs
from turbotrain.core.timing import interleaved_latency_ms
from turbotrain.models import from_checkpoint

BASE = RUNS / "resnet18_fashion"
# result file -> (the compressed run, what the row compares, the seed's claim)
COMPRESSED = {
    "prune": (RUNS / "resnet18_pruned", "channel_prune", "40% FLOPs cut, 99% accuracy kept"),
    "conv_lowrank": (RUNS / "resnet18_conv_lowrank", "conv_lowrank (rank_ratio 0.25)", "-"),
}


def figures(result: dict) -> list[dict]:
    flops, acc, ms = result["macs"], result["acc1"], result["latency_ms_b32"]
    cut, kept, faster = 1 - flops["pruned"] / flops["base"], acc["pruned"] / acc["base"], 1 - ms["pruned"] / ms["base"]
    return [
        {
            "ours": f"{cut:.0%} fewer MACs, {kept:.1%} of top-1 kept ({acc['pruned']:.4f} vs {acc['base']:.4f}), "
            f"{faster:.0%} lower batch-32 latency ({ms['pruned']:.1f} vs {ms['base']:.1f} ms)",
            "ratio": ms["base"] / ms["pruned"],
        }
    ]


def run(name: str = "prune", base: Path = BASE, repeats: int = 15) -> Path:
    pruned, method, claim = COMPRESSED[name]
    for d in (base, pruned):
        if not (d / "checkpoints" / "best.pt").is_file():
            raise SystemExit(f"bench prune: {d}/checkpoints/best.pt missing; {__doc__.splitlines()[2]}")
    ckpts = {name: load(d / "checkpoints" / "best.pt") for name, d in (("base", base), ("pruned", pruned))}
    models = {name: from_checkpoint(c, name) for name, c in ckpts.items()}
    arch = ckpts["base"]["arch"]
    x = torch.randn(32, arch["in_channels"], arch["image_size"], arch["image_size"])
    with torch.no_grad():
        ms = interleaved_latency_ms(models, x, repeats=repeats)
    flops = {name: count_macs(m, x[:1]) for name, m in models.items()}
    acc = {name: c["state"]["best_val_acc1"] for name, c in ckpts.items()}
    payload = {
        "runs": [os.path.relpath(d, ROOT) for d in (base, pruned)],
        "image_size": arch["image_size"],
        "macs": flops,
        "acc1": acc,
        "latency_ms_b32": ms,
    }
    rows = [
        {
            "what": f"{method} resnet18 @{arch['image_size']}px Fashion-MNIST, 1 fine-tune epoch",
            "seed": claim,
            **figures(payload)[0],
        }
    ]
    return write(name, {**payload, "rows": rows})


if __name__ == "__main__":
    print(run(*sys.argv[1:]))
