"""A scheduler's requeue (SLURM, submitit): which job this process belongs to, whether this start
continues a job that was stopped and requeued, and handing the stop on to whoever requeues.

SLURM sends a signal before the time limit (`sbatch --signal=USR2@120`; submitit and
hydra-submitit-launcher use USR2, Lightning's convention is USR1). The run stops on it as on
SIGTERM (every rank at one agreed step, last.pt written) and rank 0 notes the job in
`checkpoints/requeue.json`. Then:
- under submitit, its own handler (installed before the run's) runs next: it calls the launcher's
  `checkpoint()` and requeues the job, which reruns the same call in the same run dir;
- under a plain sbatch job, rank 0 asks SLURM to requeue it (`scontrol requeue $SLURM_JOB_ID`;
  the job needs `--requeue`).
The requeued job (SLURM_RESTART_COUNT > 0, or the same job id as the note) continues the run in
its dir without a typed trainer.resume; any other job in that dir is still refused."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
from pathlib import Path

from turbotrain.core.atomic import atomic_write_text

log = logging.getLogger("turbotrain")
NOTE = "requeue.json"


def job_id() -> str | None:
    """The scheduler's id of this job (an array task counts as its own job), or None."""
    if array := os.environ.get("SLURM_ARRAY_JOB_ID"):
        return f"slurm:{array}_{os.environ.get('SLURM_ARRAY_TASK_ID', '')}"
    if job := os.environ.get("SLURM_JOB_ID"):
        return f"slurm:{job}"
    if job := os.environ.get("SUBMITIT_LOCAL_JOB_ID"):
        return f"submitit-local:{job}"
    return None


def slurm_restarts() -> int:
    """How often SLURM has requeued this job (0 outside SLURM)."""
    return int(os.environ.get("SLURM_RESTART_COUNT") or 0)


def requeued(run_dir: Path) -> bool:
    """This start continues the run in `run_dir` of a job that was stopped for requeue."""
    if slurm_restarts():
        return True
    job, note = job_id(), Path(run_dir) / "checkpoints" / NOTE
    if job is None or not note.is_file():
        return False
    try:
        return json.loads(note.read_text()).get("job") == job
    except (OSError, ValueError):
        return False


def note_stop(ckpt_dir: Path, signum: int, step: int) -> None:
    """Rank 0, after last.pt: the job that stopped for requeue, so its rerun may continue here."""
    record = {"job": job_id(), "signal": signal.Signals(signum).name, "step": step}
    atomic_write_text(ckpt_dir / NOTE, json.dumps(record) + "\n")


def forget(ckpt_dir: Path) -> None:
    """The run has finished: no requeue of this job continues it."""
    (ckpt_dir / NOTE).unlink(missing_ok=True)


def hand_on(signum: int, previous, why: str) -> None:
    """After the run stopped on requeue signal `signum` (last.pt written): `previous` is the
    handler this process had before the run's own. A Python handler (submitit's) runs now, as if
    the signal had just arrived: it checkpoints the call and requeues the job, and exits. Else,
    under SLURM, the job is requeued with scontrol. Call it in the job's leading process only;
    `why` is the stop's message, logged here because a scheduler's handler may exit the process."""
    if callable(previous) and previous is not signal.default_int_handler:
        log.warning("%s; handing %s on to the scheduler's handler", why, signal.Signals(signum).name)
        previous(signum, None)
        return
    job = os.environ.get("SLURM_JOB_ID")
    if job is None:
        return
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        name = signal.Signals(signum).name
        log.warning("SLURM job %s stopped on %s, but scontrol is not on PATH: requeue it yourself", job, name)
        return
    done = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True, timeout=60)
    if done.returncode:
        log.warning("scontrol requeue %s failed (%s): is the job submitted with --requeue?", job, done.stderr.strip())
    else:
        log.info("asked SLURM to requeue job %s; it continues this run from last.pt", job)
