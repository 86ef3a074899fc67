"""What this CPU's instruction sets are, from Linux's /proc/cpuinfo: the kernels torch and ONNX
Runtime pick (bf16, VNNI, AMX) depend on them."""

from __future__ import annotations

import functools
from pathlib import Path


@functools.cache
def cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags; None where /proc/cpuinfo cannot be read (not Linux): each caller
    says what it assumes then."""
    try:
        return frozenset(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return None
