"""Operations on a model's module tree: calling it on a batch's inputs, eval mode for a block of
code, replacing a submodule by its dotted name, and counting forward FLOPs (and multiply-accumulates)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


def forward(model: nn.Module, inputs) -> torch.Tensor:
    """Logits for an image tensor or a text batch (a dict of tensors; transformers' output object)."""
    out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
    return out.logits if hasattr(out, "logits") else out


@contextlib.contextmanager
def eval_mode(model) -> Iterator[None]:
    """Eval mode inside the block, the model's own mode after it (frozen TorchScript modules have
    no training flag and are left alone)."""
    was_training = getattr(model, "training", False)
    if was_training:
        model.eval()
    try:
        yield
    finally:
        if was_training:
            model.train()


def replace_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, new)


def count_flops(model: nn.Module, example) -> int | None:
    """Forward FLOPs of `example` (a tensor, or a dict of model keyword inputs) by torch's own
    counter: 2 per multiply-accumulate of convolutions, matmuls and attention. None where an op
    cannot be counted: the figure is informative only."""
    try:
        with eval_mode(model), torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(**example) if isinstance(example, dict) else model(example)
        return int(counter.get_total_flops())
    except Exception:
        return None


def count_macs(model: nn.Module, example) -> int:
    """Multiply-accumulates of one forward pass: the same counter as count_flops, halved."""
    flops = count_flops(model, example)
    if flops is None:
        raise ValueError(f"{type(model).__name__}: torch's FLOP counter cannot count this model")
    return flops // 2
