"""Which checkpoint a start resumes, and which run dirs it may write in: resume.resolve and
resume.check_run_dir_free on their own, against the files a run leaves (the whole-run tests are
in test_resume.py and test_requeue.py)."""

from __future__ import annotations

import logging
import os
import signal

import pytest

from turbotrain.config import ConfigError
from turbotrain.train import resume
from turbotrain.train.requeue import note_stop


@pytest.fixture(autouse=True)
def _no_scheduler(monkeypatch):
    """This process is no job of SLURM, submitit or the elastic agent, whatever started pytest."""
    for name in [k for k in os.environ if k.startswith(("SLURM_", "SUBMITIT_", "TORCHELASTIC_"))]:
        monkeypatch.delenv(name)


@pytest.mark.parametrize("how", ["elastic restart", "requeued job"])
def test_a_restarted_fork_continues_from_its_own_last_checkpoint_once_it_has_one(tmp_path, monkeypatch, how):
    """A fork (trainer.resume=<another run's checkpoint>) that is restarted or requeued keeps its
    typed trainer.resume: before its first checkpoint it starts again from the parent's, after it
    continues its own, never falling back to the parent's and losing its steps."""
    parent, fork = tmp_path / "parent" / "checkpoints" / "last.pt", tmp_path / "fork"
    (fork / "checkpoints").mkdir(parents=True)
    assert resume.resolve(str(parent), fork) == parent  # its first start
    if how == "elastic restart":
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    else:
        monkeypatch.setenv("SLURM_JOB_ID", "7")
        note_stop(fork / "checkpoints", signal.SIGUSR2, step=5)
    assert resume.resolve(str(parent), fork) == parent  # stopped before its first checkpoint
    own = fork / "checkpoints" / "last.pt"
    own.write_bytes(b"")
    assert resume.resolve(str(parent), fork) == own
    assert resume.resolve(None, fork) == resume.resolve("auto", fork) == own


def test_a_run_resumes_its_own_last_checkpoint_when_asked_or_restarted_and_never_unasked(tmp_path, monkeypatch, caplog):
    run = tmp_path / "run"
    last = run / "checkpoints" / "last.pt"
    with caplog.at_level(logging.INFO, logger="turbotrain"):
        assert resume.resolve("auto", run) is None
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    with caplog.at_level(logging.INFO, logger="turbotrain"):
        assert resume.resolve(None, run) is None  # a worker restarted before the run's first checkpoint
    assert caplog.messages == [f"trainer.resume=auto: no {last} yet, starting fresh"] * 2
    last.parent.mkdir(parents=True)
    last.write_bytes(b"")
    assert resume.resolve(None, run) == last
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT")
    assert resume.resolve("auto", run) == last
    assert resume.resolve(None, run) is None  # a new job in a run's dir (which the run refuses) resumes nothing unasked


RUN_FILES = {"checkpoints": "checkpoints/last.pt", "metrics.jsonl": "metrics.jsonl", "summary.json": "summary.json"}


@pytest.mark.parametrize("held", [["checkpoints"], ["metrics.jsonl"], ["summary.json"], list(RUN_FILES)])
def test_a_fresh_run_or_a_fork_is_refused_a_dir_holding_any_of_a_runs_files(held, tmp_path):
    run = tmp_path / "run"
    for name in held:
        (run / RUN_FILES[name]).parent.mkdir(parents=True, exist_ok=True)
        (run / RUN_FILES[name]).write_bytes(b"")
    with pytest.raises(ConfigError) as fresh:
        resume.check_run_dir_free(run, None)
    assert str(fresh.value) == (
        f"run dir {run} already holds a run ({', '.join(held)}): continue it with trainer.resume=auto, "
        "or start a new run in another dir (hydra.run.dir=...)"
    )
    other = tmp_path / "other" / "checkpoints" / "last.pt"
    with pytest.raises(ConfigError) as fork:
        resume.check_run_dir_free(run, str(other))
    assert str(fork.value) == (
        f"trainer.resume={other} is another run's checkpoint: continuing it here starts a fork of that run, "
        f"and run dir {run} already holds a run ({', '.join(held)}): fork into a new dir (hydra.run.dir=...)"
    )
    resume.check_run_dir_free(run, "auto")  # continuing the run itself
    resume.check_run_dir_free(run, str(run / "checkpoints" / "best.pt"))
    resume.check_run_dir_free(tmp_path / "new", None)
    resume.check_run_dir_free(tmp_path / "new", str(other))  # a fork into a fresh dir
