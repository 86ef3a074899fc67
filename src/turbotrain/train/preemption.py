"""SIGTERM/SIGINT (preemption, Ctrl-C) and a scheduler's requeue signals (trainer.requeue_signals,
SIGUSR1/SIGUSR2): stop within one batch wherever the run is, write last.pt when there is
training worth keeping, exit 128 + signal (requeue.py says who requeues the job)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path


class Preempted(RuntimeError):
    """Raised after the checkpoint is written; `signum` decides the exit code (128 + signum)."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum


class StopFlag:
    """A run's stop request: the signal received since its watch_signals block began, if any.
    Loops that run outside the optimizer step (validation, start-up, autotune trials,
    fine-tuning) take it and poll it once per batch."""

    signum: int | None = None

    def stop_now(self, where: str) -> None:
        """Raise Preempted when a signal has arrived and nothing is worth saving at this point."""
        if self.signum is not None:
            name = signal.Signals(self.signum).name
            raise Preempted(self.signum, f"stopped by {name} during {where}; no training was lost (none had started)")


def resume_hint(run_dir: Path | str) -> str:
    return f"resume with: python train.py trainer.resume=auto hydra.run.dir={run_dir} (plus your overrides)"


def requeue_signals(names) -> tuple[signal.Signals, ...]:
    """trainer.requeue_signals as signals."""
    return tuple(signal.Signals[name] for name in names)


@contextlib.contextmanager
def watch_signals(requeue: tuple[signal.Signals, ...] = ()) -> Iterator[StopFlag]:
    """Within the block, SIGTERM/SIGINT and the `requeue` signals only set `flag.signum`; the loops
    check it once per batch. Further SIGTERMs and requeue signals are ignored: a cluster sends them
    in bursts (SLURM signals every process of a job step, and torch's elastic agent forwards one
    more), and none may cut the checkpoint write short. A second SIGINT (Ctrl-C again at a
    terminal) stops at once with KeyboardInterrupt."""
    flag = StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag  # signal handlers can only be set from the main thread
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, *requeue)}

    def handler(signum, frame):
        if flag.signum is None:
            flag.signum = signum
        elif signum == signal.SIGINT:
            for s, h in previous.items():
                signal.signal(s, h)
            raise KeyboardInterrupt

    for s in previous:
        signal.signal(s, handler)
    try:
        yield flag
    finally:
        for s, h in previous.items():  # once stopping, the rest of a burst must not cut the exit short
            signal.signal(s, signal.SIG_IGN if flag.signum is not None and s != signal.SIGINT else h)
