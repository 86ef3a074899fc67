"""TorchScript conversion, reloading, and the wrappers that give text models a traceable signature.

Scripting keeps the quantized kernels fast (we measured tracing of quantized CNNs
as much slower); `export.py` still times every candidate and keeps the fastest.
"""

from __future__ import annotations

import io

import torch
from torch import nn


def convert(model: nn.Module, example: tuple, method: str) -> torch.jit.ScriptModule:
    model.eval()
    with torch.no_grad():
        return torch.jit.script(model) if method == "script" else torch.jit.trace(model, example)


def frozen(module: torch.jit.ScriptModule) -> torch.jit.ScriptModule:
    """A frozen copy (constants folded, attributes inlined); `module` itself is left as it was."""
    return torch.jit.freeze(module.eval())


def state_dict_mb(model: nn.Module) -> float:
    """Size of the float weights as torch.save writes them (how fp32 checkpoints are compared)."""
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.tell() / 2**20


def reload(module: torch.jit.ScriptModule) -> torch.jit.ScriptModule:
    """Save and load back, in memory: candidates are timed as they will ship, as loaded from a
    file with a fresh executor state."""
    buf = io.BytesIO()
    torch.jit.save(module, buf)
    buf.seek(0)
    return torch.jit.load(buf)


class TextLogits(nn.Module):
    """A transformers classifier as positional (input_ids, attention_mask) -> logits: the form
    torch.jit.trace records and a deployed artifact is called with."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0]


class KeywordInputs(nn.Module):
    """Lets the training loop's evaluate (which passes text batches as keywords) call a positional
    artifact."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.module(input_ids, attention_mask)
