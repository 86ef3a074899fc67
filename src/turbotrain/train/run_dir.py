"""One run, one dir, across the ranks of a torchrun job, its restarts and a SLURM requeue: rank 0
keeps Hydra's run dir and notes it for a restarted group or the requeued job (whose `${now:}`
would name a new dir); the other ranks learn it over the process group."""

from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch.distributed as dist
from omegaconf import OmegaConf

from turbotrain.core.atomic import atomic_write_text
from turbotrain.train import requeue
from turbotrain.train.distributed import SELF_LAUNCHED, DistInfo, in_worker_env
from turbotrain.train.resume import restarts, run_files
from turbotrain.train.tracking import start_ticks

RUN_DIR_NOTES = Path("outputs/.torchrun")
SLURM_NOTES = Path("outputs/.slurm")


def _rank0_dir_file() -> Path:
    """Where rank 0 of a torchrun job notes its run dir, so that rank 0 restarted by the elastic
    agent (--max-restarts) continues in it. Keyed by the rendezvous id and the agent's pid and
    start time: the id alone is "none" for every torchrun without --standalone or --rdzv-id, and
    a pid is reused once its process is gone."""
    agent = os.getppid()
    try:
        started = start_ticks(agent)
    except OSError:  # no /proc: the pid alone
        started = 0
    return RUN_DIR_NOTES / f"{os.environ.get('TORCHELASTIC_RUN_ID', 'none')}-{agent}-{started}"


def _slurm_note() -> Path | None:
    """Where the leading process of a SLURM job notes its run dir, for the requeued job."""
    job = requeue.job_id()
    return SLURM_NOTES / job.replace(":", "-") if job and job.startswith("slurm:") else None


def _notes() -> dict[Path, int]:
    """The leading process's notes of its run dir, each with how often this job has started again
    since: torchrun's rank 0 (its agent's restarts); a SLURM job's plain process or rank 0 (its
    requeues). Workers that turbotrain launches itself, and other ranks, note nothing."""
    if in_worker_env() and (os.environ.get(SELF_LAUNCHED) or int(os.environ["RANK"]) != 0):
        return {}
    notes = {_rank0_dir_file(): restarts()} if in_worker_env() else {}
    if (slurm := _slurm_note()) is not None:
        notes[slurm] = requeue.slurm_restarts()
    return notes


def run_dir_argv(argv: list[str]) -> list[str]:
    """Under torchrun every rank runs Hydra and would resolve `${now:}` into its own run dir. Rank 0
    keeps Hydra's choice (or, restarted by the agent or requeued by SLURM, the dir it noted); the
    other ranks run Hydra in a throw-away dir and learn rank 0's dir through the process group
    (`agree_run_dir`), so no file on a shared disk can go stale. A plain process requeued by SLURM
    continues in its noted dir too. `--local-rank` (torch.distributed.launch) is dropped: Hydra
    would read it as an override."""
    argv = [a for a in argv if not re.match(r"--local[-_]rank", a)]
    pinned = any(a.startswith("hydra.run.dir=") for a in argv) or {"-m", "--multirun"} & set(argv)
    if pinned or (in_worker_env() and os.environ.get(SELF_LAUNCHED)):
        return argv
    if not in_worker_env() or int(os.environ["RANK"]) == 0:
        for note, again in _notes().items():
            if again and note.is_file():
                return [*argv, f"hydra.run.dir={note.read_text().strip()}"]
        return argv
    scratch = tempfile.mkdtemp(prefix=f"turbotrain-rank{os.environ['RANK']}-")
    atexit.register(shutil.rmtree, scratch, True)
    return [*argv, f"hydra.run.dir={scratch}"]


def save_hydra_files(run_dir: Path, cfg, hydra_cfg) -> None:
    """.hydra/config.yaml, hydra.yaml and overrides.yaml, as Hydra writes them (conf/train.yaml
    turns Hydra's own writing off: it writes before train() can check the dir), into a dir that
    holds no run yet. A refused re-run, or a resume, leaves the run's own files as they were (its
    checkpoints and summary record what a resume changed). Written once: by the process that
    launches the workers, or by rank 0 under torchrun."""
    if (in_worker_env() and not _notes()) or run_files(run_dir):
        return
    files = {"config.yaml": cfg, "hydra.yaml": hydra_cfg, "overrides.yaml": hydra_cfg.hydra.overrides.task}
    for name, node in files.items():
        atomic_write_text(run_dir / ".hydra" / name, OmegaConf.to_yaml(node))


def note_run_dir(run_dir: Path) -> None:
    """Rank 0 under torchrun, or a SLURM job's process: remember the run dir for restarts and the
    requeue of this job. Once the run has begun (metrics.jsonl exists) the note outlives this
    process whatever ends it (an error, a stop, a peer's death: each may be followed by a restart
    or requeue); `forget_run_dir` removes it when the run has finished. A start that failed
    before that (a refused config) leaves no note."""
    for note in _notes():
        atomic_write_text(note, str(Path(run_dir).resolve()))
    if _notes():
        atexit.register(_forget_unless_begun, Path(run_dir))


def _forget_unless_begun(run_dir: Path) -> None:
    if not (run_dir / "metrics.jsonl").exists():
        forget_run_dir()


def forget_run_dir() -> None:
    """The run has finished (summary.json written): no restart or requeue will continue it."""
    for note in _notes():
        note.unlink(missing_ok=True)


def agree_run_dir(run_dir: Path, info: DistInfo) -> Path:
    """Rank 0's run dir, on every rank."""
    if not info.enabled:
        return run_dir
    box = [str(Path(run_dir).resolve())]
    dist.broadcast_object_list(box, src=0, group=info.cpu_group)
    return Path(box[0])
