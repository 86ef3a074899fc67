"""SIGTERM/SIGINT (preemption, Ctrl-C): finish the current optimizer step, write last.pt, exit."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class Preempted(RuntimeError):
    """Raised after the checkpoint is written; `signum` decides the exit code (128 + signum)."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum


class StopFlag:
    signum: int | None = None


@contextlib.contextmanager
def watch_signals() -> Iterator[StopFlag]:
    """Within the block, SIGTERM/SIGINT only set `flag.signum`; the training loop checks it after
    each optimizer step. A second signal gets the default behaviour (immediate exit)."""
    flag = StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag  # signal handlers can only be set from the main thread
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def handler(signum, frame):
        flag.signum = signum
        for s, h in previous.items():
            signal.signal(s, h)

    for s in previous:
        signal.signal(s, handler)
    try:
        yield flag
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
