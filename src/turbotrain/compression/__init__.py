"""Compression group: model surgery that changes what is trained and exported.

`apply_compression` runs the configured technique on a (usually pre-trained, see
`compression.from_run`) model and measures it: accuracy and batch-32 CPU latency before and
right after, FLOPs and params. Fine-tuning afterwards is the ordinary training loop.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable

import torch
from torch import nn

from turbotrain.compression import lowrank, prune
from turbotrain.loop import forward

log = logging.getLogger("turbotrain")


def apply_compression(
    model: nn.Module,
    cfg,
    *,
    example,
    evaluate: Callable[[nn.Module], float],
    finetune: Callable[[nn.Module], None] | None = None,
    grad_batch: Callable[[nn.Module], None] | None = None,
) -> dict | None:
    if cfg.name == "none":
        return None
    from turbotrain.deploy.script import interleaved_latency_ms  # timing helper shared with export

    before = copy.deepcopy(model).eval()
    acc_before = evaluate(model)
    if cfg.name == "channel_prune":
        report = prune.channel_prune(model, example[:1], cfg, grad_batch=grad_batch, finetune=finetune)
    elif cfg.name == "weight_prune":
        report = prune.weight_prune(model, cfg.sparsity)
    elif cfg.name == "embed_lowrank":
        report = lowrank.factorize(model, cfg.targets, cfg.rank, cfg.energy)
    else:
        raise AssertionError(cfg.name)  # validate() admits only known names
    model.eval()
    batch = {k: v[:32] for k, v in example.items()} if isinstance(example, dict) else example[:32]
    with torch.no_grad():
        fns = {"before": lambda x: forward(before, x), "after": lambda x: forward(model, x)}
        ms = interleaved_latency_ms(fns, batch, repeats=7)
    report.update(
        acc1_before=acc_before,
        acc1_after=evaluate(model),  # before fine-tuning
        latency_ms_b32_before=ms["before"],
        latency_ms_b32_after=ms["after"],
    )
    log.info(
        "%s: MACs %s, params %s -> %s, top-1 %.4f -> %.4f (before fine-tuning), batch-32 CPU latency %.1f -> %.1f ms",
        cfg.name,
        f"-{report['macs_reduction']:.0%}" if "macs_reduction" in report else "not reduced",
        report.get("params_before", "-"),
        report.get("params_after", "-"),
        acc_before,
        report["acc1_after"],
        ms["before"],
        ms["after"],
    )
    return report
