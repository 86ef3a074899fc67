"""A scheduler's requeue: SIGUSR2 (sbatch --signal=USR2@120, submitit) before the time limit stops
every rank at one agreed step with last.pt written and exits 128 + signal; the requeued job
(SLURM_RESTART_COUNT=1, the same command in the same dir) continues the run by itself and ends
with the uninterrupted run's weights; any other job in that dir is still refused. The signal is
real: a worker sends it at a fixed step, to itself or to the process SLURM would signal."""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest

from conftest import ROOT, TINY, make_cfg, run_cli
from test_train import assert_same_run
from turbotrain.train.preemption import Preempted
from turbotrain.train.run import train

RUN = (*TINY, "trainer.max_epochs=2", "trainer.limit_train_batches=10", "trainer.log_every_n_steps=2")

# At optimizer step 5 the process named by TT_SIGNAL_TO gets SIGUSR2: "self" in a plain process;
# "launcher" from DDP rank 1 (the task SLURM signals when turbotrain launches the workers itself).
SITE = """
import os, signal
from turbotrain.train import session

real = session.Run.on_step


def on_step(self, s):
    to = os.environ.get("TT_SIGNAL_TO")
    once = os.environ.get("TT_SIGNAL_ONCE")  # a file: the requeued job is not signalled again
    if s.global_step == 5 and to == "self" and not (once and os.path.exists(once)):
        if once:
            open(once, "w").close()
        os.kill(os.getpid(), signal.SIGUSR2)
    if s.global_step == 5 and to == "launcher" and os.environ.get("RANK") == "1":
        os.kill(os.getppid(), signal.SIGUSR2)
    real(self, s)


session.Run.on_step = on_step
"""


def _env(tmp_path, **extra) -> dict:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_"))}
    return {**env, "PYTHONPATH": str(site), **extra}


def _requeued_run_equals_uninterrupted(tmp_path, *extra: str, signal_to: str, sbatch: bool = False):
    """With `sbatch`, a plain `sbatch --requeue` job: the run dir is Hydra's default (`${now:}`,
    which the requeued job resolves anew) and rank 0 calls a real `scontrol` on PATH, which notes
    its arguments."""
    full, split = tmp_path / "full", tmp_path / "split"
    r = run_cli("train.py", *RUN, *extra, f"hydra.run.dir={full}", env=_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    job = {}
    if sbatch:
        scontrol = tmp_path / "bin" / "scontrol"
        scontrol.parent.mkdir()
        scontrol.write_text(f'#!/bin/sh\necho "$@" > {tmp_path / "scontrol.args"}\n')
        scontrol.chmod(0o755)
        job = {"SLURM_JOB_ID": "4242", "PATH": f"{scontrol.parent}:{os.environ['PATH']}"}
    where = () if sbatch else (f"hydra.run.dir={split}",)
    r = run_cli("train.py", *RUN, *extra, *where, env=_env(tmp_path, TT_SIGNAL_TO=signal_to, **job), cwd=tmp_path)
    assert r.returncode == 128 + signal.SIGUSR2, r.stderr[-3000:]
    if sbatch:
        (split,) = (tmp_path / "outputs" / "train").iterdir()
        assert (tmp_path / "scontrol.args").read_text().split() == ["requeue", "4242"]
    assert "stopped by SIGUSR2" in r.stderr
    note = json.loads((split / "checkpoints" / "requeue.json").read_text())
    assert note["signal"] == "SIGUSR2" and note["step"] >= 5
    # a fresh job in the same dir is refused, as before
    r = run_cli("train.py", *RUN, *extra, f"hydra.run.dir={split}", env=_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and "already holds a run" in r.stderr, r.stderr[-2000:]
    # the requeued job: the same command, no trainer.resume
    requeued = _env(tmp_path, SLURM_RESTART_COUNT="1", **job)
    r = run_cli("train.py", *RUN, *extra, *where, env=requeued, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resumed from {split / 'checkpoints' / 'last.pt'}" in (split / "train.log").read_text()
    assert_same_run(full, split)
    assert not (split / "checkpoints" / "requeue.json").exists()  # finished: no requeue continues it
    return note


def test_sigusr2_stops_a_plain_process_and_the_requeued_job_continues_it(tmp_path):
    note = _requeued_run_equals_uninterrupted(tmp_path, signal_to="self")
    assert note["step"] == 5  # the step the signal arrived in


def test_sigusr2_to_a_launcher_in_this_process_stops_its_workers_and_then_reaches_the_schedulers_handler(
    tmp_path, monkeypatch, caplog
):
    """train() launching the DDP workers itself, as train.py does; rank 1 signals this process at
    step 5. The handler found in place (submitit's, here a recorder) must not see the signal when it
    arrives, only once the workers have saved and stopped. (The requeued job: the slow test below.)"""
    site = _env(tmp_path)["PYTHONPATH"]
    monkeypatch.setenv("PYTHONPATH", site)
    monkeypatch.setenv("TT_SIGNAL_TO", "launcher")
    monkeypatch.setattr(sys, "argv", [str(ROOT / "train.py")])  # the workers run the script that launched them
    run = tmp_path / "run"
    seen = []
    previous = signal.signal(signal.SIGUSR2, lambda s, _: seen.append((s, (run / "checkpoints" / "requeue.json").exists())))
    try:
        args = (*RUN, "distributed=ddp", "distributed.nproc=2")
        with pytest.raises(Preempted) as stopped, caplog.at_level("WARNING", logger="turbotrain"):
            train(make_cfg(*args), run, overrides=args)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert stopped.value.signum == signal.SIGUSR2
    handing = [r.getMessage() for r in caplog.records if "scheduler's handler" in r.getMessage()]
    assert handing == [f"{stopped.value}; handing SIGUSR2 on to the scheduler's handler"]  # why, before it may exit
    assert seen == [(signal.SIGUSR2, True)]  # once, after the workers' requeue note was written
    assert json.loads((run / "checkpoints" / "requeue.json").read_text())["step"] >= 5


@pytest.mark.slow  # three more runs; the test above covers the stop and the resume
def test_a_plain_sbatch_job_asks_slurm_to_requeue_and_continues_in_its_default_run_dir(tmp_path):
    note = _requeued_run_equals_uninterrupted(tmp_path, signal_to="self", sbatch=True)
    assert note["job"] == "slurm:4242"
    assert len(list((tmp_path / "outputs" / "train").iterdir())) == 1  # no second dir
    assert not list((tmp_path / "outputs" / ".slurm").iterdir())  # the finished run's note is gone


@pytest.mark.slow  # ~35 s of 2-process runs
def test_sigusr2_to_the_launcher_stops_every_ddp_rank_at_one_step_and_the_requeued_job_continues(tmp_path):
    _requeued_run_equals_uninterrupted(tmp_path, "distributed=ddp", "distributed.nproc=2", signal_to="launcher")


@pytest.mark.slow  # ~25 s: submitit's local executor
def test_submitit_requeues_the_job_on_sigusr2_and_its_rerun_continues_the_run(tmp_path):
    """hydra-submitit-launcher's local executor (submitit's own preemption path): our handler saves,
    then hands the signal on to submitit's, which calls the launcher's checkpoint() and requeues;
    the requeued call continues the run in its sweep dir."""
    full, sweep = tmp_path / "full", tmp_path / "sweep"
    r = run_cli("train.py", *RUN, f"hydra.run.dir={full}", env=_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    env = _env(tmp_path, TT_SIGNAL_TO="self", TT_SIGNAL_ONCE=str(tmp_path / "signalled"))
    args = ("-m", "hydra/launcher=submitit_local", f"hydra.launcher.submitit_folder={tmp_path / 'submitit'}")
    r = run_cli("train.py", *args, *RUN, f"hydra.sweep.dir={sweep}", env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "signalled").exists()
    log = (sweep / "0" / "train.log").read_text()
    assert "stopped by SIGUSR2 at step 5" in log and "Requeued job" in log, log[-3000:]
    assert "resumed from" in log and "at epoch 0, step 5" in log, log[-3000:]
    assert_same_run(full, sweep / "0")
