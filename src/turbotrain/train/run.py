"""train(cfg, run_dir): the one place that fixes the order of a training run."""

from __future__ import annotations

import json
import logging
import signal
from pathlib import Path

from turbotrain.config.validation import validate
from turbotrain.core.allocator import configure_malloc
from turbotrain.core.seeds import seed_everything
from turbotrain.train import distributed as dist
from turbotrain.train import requeue, resume
from turbotrain.train.loop import Diverged
from turbotrain.train.numerics import set_kernels, set_threads
from turbotrain.train.preemption import Preempted, requeue_signals, watch_signals
from turbotrain.train.profiling import profiler
from turbotrain.train.run_dir import agree_run_dir
from turbotrain.train.session import Run

log = logging.getLogger("turbotrain")


class TrainingError(RuntimeError):
    """Training cannot go on (diverged); the message says where the last good checkpoint is."""


def train(cfg, run_dir: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> float:
    """Run training as configured; returns the best validation top-1 (for sweepers).
    `overrides` are the command line's, handed to DDP workers when this process launches them."""
    validate(cfg)
    run_dir = Path(run_dir)
    # before the run's own handlers: a requeue signal's (submitit's) is handed the stop on
    previous = {s: signal.getsignal(s) for s in requeue_signals(cfg.trainer.requeue_signals)}
    try:
        if dist.launches(cfg.distributed):
            return launch_workers(cfg, run_dir, overrides)
        return train_here(cfg, run_dir)
    except Preempted as e:
        if e.signum in previous and dist.leads_job():
            requeue.hand_on(e.signum, previous[e.signum], str(e))
        raise


def launch_workers(cfg, run_dir: Path, overrides) -> float:
    """This process only launches the workers (distributed=ddp outside torchrun); they train
    and rank 0 writes summary.json, whose best top-1 is the run's result."""
    resume.check_run_dir_free(run_dir, cfg.trainer.resume)  # fail here, not in a worker
    signals = requeue_signals(cfg.trainer.requeue_signals)
    dist.DISTRIBUTED.of(cfg.distributed).build(cfg.distributed, run_dir, list(overrides), signals)
    return json.loads((run_dir / "summary.json").read_text())["best_val_acc1"]


def train_here(cfg, run_dir: Path) -> float:
    """Train in this process: alone, or as one rank of a DDP group."""
    seed_everything(cfg.trainer.seed)
    configure_malloc(cfg.trainer.malloc)
    set_threads(cfg.trainer.threads)
    with watch_signals(requeue_signals(cfg.trainer.requeue_signals)) as stop:
        info, device = dist.setup(cfg.distributed, cfg.trainer.device)
        try:
            run_dir = agree_run_dir(run_dir, info)
            set_kernels(cfg.trainer.deterministic, device)
            with profiler(cfg.profiler, run_dir, device, info.is_main) as profile_step:
                return Run(cfg, run_dir, info, device, stop, profile_step).fit()
        except Diverged as e:
            last = run_dir / "checkpoints" / "last.pt"
            good = f"last good checkpoint: {last}" if last.is_file() else "no checkpoint was written yet"
            raise TrainingError(
                f"training diverged: {e} (trainer.on_nan={cfg.trainer.on_nan}); {good}. "
                "Try a lower optim.lr, trainer.grad_clip, or precision=fp32"
            ) from e
        finally:
            dist.teardown(info)
