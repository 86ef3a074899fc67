"""TorchScript conversion and latency measurement.

Scripting keeps the quantized kernels fast (we measured tracing of quantized CNNs
as much slower); `export.py` still times every candidate and keeps the fastest.
"""

from __future__ import annotations

import io
import math
import statistics
import time
from collections.abc import Callable

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


@torch.no_grad()
def interleaved_latency_ms(
    fns: dict[str, Callable[..., torch.Tensor]],
    example: torch.Tensor | tuple,
    *,
    repeats: int,
    warmup: int = 5,
    block_s: float = 0.005,
) -> dict[str, float]:
    """Median ms per call of each fn. Candidates alternate block by block (A, B, A, B...)
    so drifts of a shared machine hit them alike; a block repeats one fn for ~block_s,
    because alternating single sub-millisecond calls measures cache thrash, not the model.
    A tuple `example` is passed as positional arguments."""
    args = example if isinstance(example, tuple) else (example,)
    inner = {}
    for name, fn in fns.items():
        t0 = time.perf_counter()
        for _ in range(warmup):
            fn(*args)
        per_call = (time.perf_counter() - t0) / warmup
        inner[name] = max(1, min(100, math.ceil(block_s / max(per_call, 1e-6))))
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(inner[name]):
                fn(*args)
            times[name].append((time.perf_counter() - t0) / inner[name])
    return {name: 1000 * statistics.median(ts) for name, ts in times.items()}


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
