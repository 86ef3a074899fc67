"""Compression group: model surgery that changes what is trained and exported.

Each method registers in COMPRESSION with its schema; `apply_compression` runs the configured one
on a (usually pre-trained, see `compression.from_run`) model and measures it: accuracy and
batch-32 CPU latency before and right after, FLOPs and params. Fine-tuning afterwards is the
ordinary training loop. A method that changes the module tree also registers a `structure`
trait, (read, restore): what a checkpoint records so the shapes can be rebuilt without the run.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from turbotrain.core.checkpoint_trust import int_in, register_arch_check
from turbotrain.core.modules import forward
from turbotrain.core.registry import Registry
from turbotrain.core.schema import setting
from turbotrain.core.timing import interleaved_latency_ms

log = logging.getLogger("turbotrain")
COMPRESSION = Registry("compression")
STRUCTURE_BOUND = (1, 65_536)  # compressed structures record {module name: group count or rank}


@dataclass
class CompressionConfig:
    name: str = "none"  # the option (compression=<name>)
    from_run: str | None = setting(None, numeric=False)  # start from this run's best.pt (the initial training phase)


@dataclass
class Surgery:
    """What a method may use besides the model: a validation-sized example batch, one backward
    pass on a training batch (gradient-based importance), a few fine-tuning steps."""

    example: torch.Tensor | dict
    grad_batch: Callable[[nn.Module], None] | None = None
    finetune: Callable[[nn.Module], None] | None = None


@COMPRESSION.register("none", CompressionConfig)
def no_compression(model: nn.Module, cfg, surgery: Surgery) -> None:
    return None


def apply_compression(model: nn.Module, cfg, *, example, evaluate: Callable[[nn.Module], float], **surgery) -> dict | None:
    option = COMPRESSION.of(cfg)
    if option.build is no_compression:
        return None
    before = copy.deepcopy(model).eval()
    acc_before = evaluate(model)
    report = option.build(model, cfg, Surgery(example[:1] if torch.is_tensor(example) else example, **surgery))
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


def _structures() -> list[tuple]:
    """(record key, read, restore) of every method that changes the module tree; module
    replacements come before channel shapes are read off a state dict (order trait)."""
    options = sorted((o for o in COMPRESSION if "structure" in o.traits), key=lambda o: o.traits.get("order", 0))
    return [o.traits["structure"] for o in options]


@register_arch_check
def _structures_in_bounds(arch: dict) -> None:
    for key in structure_keys():
        for name, value in (arch.get(key) or {}).items():
            int_in(value, STRUCTURE_BOUND, f"arch.{key}[{name!r}]")


def structure_keys() -> list[str]:
    """The `arch` keys under which checkpoints record compressed structures."""
    return [key for key, _, _ in _structures()]


def record_structure(model: nn.Module) -> dict:
    """What a checkpoint needs, beyond its state dict, to rebuild `model`'s compressed modules."""
    return {key: read(model) or None for key, read, _ in _structures()}


def restore_structure(model: nn.Module, arch: dict, state_dict: dict) -> None:
    """Give a freshly built model the compressed modules recorded in a checkpoint's `arch`."""
    for key, _, restore in _structures():
        if arch.get(key):
            restore(model, arch[key], state_dict)
