"""Paired latency measurement: candidates timed in alternating blocks in one process, so the
drift of a shared machine hits them alike (used by export, compression and the benches)."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch


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
    A block's first call is not timed: it pays for the previous candidate's caches and for its
    threads still spinning after their last call (OpenMP's, ONNX Runtime's), which on a small
    CPU hold the cores this call needs. A tuple `example` is passed as positional arguments."""
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
            fn(*args)
            t0 = time.perf_counter()
            for _ in range(inner[name]):
                fn(*args)
            times[name].append((time.perf_counter() - t0) / inner[name])
    return {name: 1000 * statistics.median(ts) for name, ts in times.items()}
