"""How the process's C allocator treats freed memory (trainer.malloc).

torch's CPU tensors come from the C library's malloc. glibc hands blocks above its mmap threshold
back to the kernel when they are freed, and trims the free top of its heap, so a training step
that allocates the same tensors as the step before gets fresh pages and pays a page fault per
4 KiB page for them again. `retain` raises both limits: freed tensors stay in the process and
the next step reuses them (resident memory then stays at the run's peak until it exits).
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger("turbotrain")

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3  # glibc's mallopt parameters
RETAIN = {
    M_MMAP_THRESHOLD: 32 << 20,  # glibc's largest: blocks up to 32 MiB come from the heap
    M_TRIM_THRESHOLD: 2**31 - 1,  # never trim the heap's free top (mallopt takes a C int)
    M_TOP_PAD: 64 << 20,  # grow the heap in 64 MiB steps
}


def configure_malloc(mode: str) -> None:
    """`retain`: keep freed memory for reuse (glibc); `system`: the C library's defaults."""
    if mode == "system":
        return
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl): its own defaults
        log.debug("trainer.malloc=%s: no glibc mallopt here; the C library's defaults stay", mode)
        return
    for param, value in RETAIN.items():
        if mallopt(param, value) != 1:
            log.debug("trainer.malloc=%s: glibc refused mallopt(%d, %d)", mode, param, value)
