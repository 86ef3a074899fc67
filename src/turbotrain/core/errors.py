"""The errors a user can fix, and how the entry points report them: one line, exit 2."""

from __future__ import annotations

import errno
import sys

import torch


class UserError(Exception):
    """An error the user can fix (a value, a file, a launch): one line on stderr, exit code 2.
    Each layer's own kinds (ConfigError, CheckpointError, DataError, ...) derive from it."""


USER_ERRORS = (UserError, FileNotFoundError)

OOM_HINT = (
    "out of memory: lower data.batch_size (keep the global batch with trainer.grad_accum_steps), use "
    "precision=amp, or attention.checkpointing=true for transformers"
)


def as_out_of_memory(error: BaseException) -> BaseException:
    """A MemoryError carrying OOM_HINT for an allocation failure (CUDA's OutOfMemoryError, or the
    CPU allocator's RuntimeError, which torch does not type), else the error unchanged."""
    first = (str(error).strip().splitlines() or [""])[0]
    cpu = isinstance(error, RuntimeError) and "DefaultCPUAllocator: can't allocate memory" in first
    if isinstance(error, torch.OutOfMemoryError) or cpu:
        return MemoryError(f"{OOM_HINT} ({first.split('] ')[-1][:200]})")
    return error


class DiskFull(UserError):
    """A write failed for lack of space (ENOSPC) or quota (EDQUOT)."""


def as_disk_full(error: BaseException) -> BaseException:
    """A DiskFull naming the file for a write that found no space (a checkpoint, a cache, the
    metrics log, a profiler trace: wherever it happened), else the error unchanged."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        where = f" writing {error.filename}" if error.filename else ""
        return DiskFull(
            f"no space left on the device{where}: free space there, or point hydra.run.dir (runs) or "
            "data.cache_dir (datasets, caches) at another disk; the last checkpoint is intact"
        )
    return error


def one_line(error: BaseException) -> str:
    """The message on one line. Errors raised in DataLoader workers arrive wrapped with the
    worker's traceback; their last line is the original message."""
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    if len(lines) > 1 and "Traceback" in str(error):
        return lines[-1].split(": ", 1)[-1]
    return " ".join(line.strip() for line in lines)


def report(error: BaseException) -> None:
    print(f"error: {one_line(error)}", file=sys.stderr)
