"""DDP runs that are stopped, killed or started without --standalone, in real 2-process gloo runs:
ranks agree on a stop, save per-rank RNG, restart elastically, and leave nothing stale."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch

from conftest import ROOT, run_cli
from test_distributed import EQUIV, _pids_with_env
from turbotrain.core.checkpoint import load

# Random flips draw from each rank's own RNG: a resume is exact only when every rank gets its
# own state back.
DDP = (
    "data=digits",
    "data.batch_size=32",
    "data.augment=[{name: RandomHorizontalFlip}]",
    "model=small_cnn",
    "model.width=8",
    "precision=fp32",
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=12",
    "trainer.log_every_n_steps=1",
    "trainer.progress_bar=false",
    "distributed=ddp",
    "distributed.nproc=2",
    "distributed.timeout_s=60",
)


def _start(args, tag: str, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "TT_TEST_TAG": tag, "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, str(ROOT / "train.py"), *args]
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _train_steps(run: Path) -> list[int]:
    path = run / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    return [e["step"] for e in map(json.loads, lines) if e["split"] == "train"]


def _wait_for_step(run: Path, proc: subprocess.Popen, step: int, timeout: float = 180) -> int:
    """Wait until rank 0 has logged `step`; returns the last step logged."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "training did not get there in time"
        steps = _train_steps(run)
        if steps and steps[-1] >= step:
            return steps[-1]
        time.sleep(0.2)


def _same_weights(a: Path, b: Path) -> None:
    x, y = load(a / "checkpoints" / "last.pt"), load(b / "checkpoints" / "last.pt")
    assert x["state"]["global_step"] == y["state"]["global_step"] and x["metrics"] == y["metrics"]
    for k, v in x["model"].items():
        assert torch.equal(v, y["model"][k]), k


@pytest.mark.slow  # real processes, ~20-70 s on a 2-core CPU: `python -m pytest -m slow`
def test_sigterm_to_one_rank_stops_both_and_resume_equals_uninterrupted(tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    r = run_cli("train.py", *DDP, f"hydra.run.dir={full}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    tag = uuid.uuid4().hex
    proc = _start([*DDP, f"hydra.run.dir={cut}"], tag, tmp_path)
    _wait_for_step(cut, proc, 3)
    for pid in _pids_with_env(tag, "1"):  # rank 1 alone
        os.kill(pid, signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "SIGTERM" in stderr and "trainer.resume=auto" in stderr and "Traceback" not in stderr, stderr[-3000:]
    saved = load(cut / "checkpoints" / "last.pt")
    assert saved["state"]["global_step"] < 24 and saved["world_size"] == 2
    assert not torch.equal(saved["rng_ranks"][0]["torch"], saved["rng_ranks"][1]["torch"])  # own streams
    r = run_cli("train.py", *DDP, "trainer.resume=auto", f"hydra.run.dir={cut}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    _same_weights(full, cut)


@pytest.mark.slow  # the default suite signals the launcher and the workers together (two_sigterms)
def test_sigterm_to_the_launcher_saves_and_exits_143(tmp_path):
    run = tmp_path / "run"
    proc = _start([*DDP, "trainer.max_epochs=50", f"hydra.run.dir={run}"], uuid.uuid4().hex, tmp_path)
    _wait_for_step(run, proc, 2)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "stopped by SIGTERM" in stderr and "Traceback" not in stderr, stderr[-3000:]
    assert load(run / "checkpoints" / "last.pt")["state"]["global_step"] >= 2


def test_two_sigterms_to_every_process_still_save_and_exit_143(tmp_path):
    """SLURM (scancel, time limit, preemption) sends SIGTERM to every process of the step, and the
    elastic agent forwards one more to its workers: none of them may cut the save short."""
    run, tag = tmp_path / "run", uuid.uuid4().hex
    slow_steps = ("model=resnet18", "data.image_size=64")  # the second signal lands before the step ends
    proc = _start([*DDP, *slow_steps, "trainer.max_epochs=50", f"hydra.run.dir={run}"], tag, tmp_path)
    _wait_for_step(run, proc, 2)
    pids = [proc.pid, *_pids_with_env(tag, "0"), *_pids_with_env(tag, "1")]
    assert len(pids) == 3
    for gap in (0.01, *[0.1] * 50):  # two SIGTERMs 10 ms apart, then more until the launcher is gone
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        time.sleep(gap)
        if proc.poll() is not None:
            break
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "stopped by SIGTERM" in stderr and "Traceback" not in stderr, stderr[-3000:]
    saved = load(run / "checkpoints" / "last.pt")["state"]["global_step"]
    assert saved >= 2
    assert max(_train_steps(run)) == saved  # saved at the step it stopped at, not an older checkpoint


@pytest.mark.slow  # real processes, ~20-70 s on a 2-core CPU: `python -m pytest -m slow`
def test_killed_rank_restarts_and_the_run_finishes(tmp_path):
    run, tag = tmp_path / "run", uuid.uuid4().hex
    args = [*DDP, "trainer.max_epochs=3", "trainer.checkpoint_every_n_steps=4", "distributed.max_restarts=1"]
    proc = _start([*args, f"hydra.run.dir={run}"], tag, tmp_path)
    at_kill = _wait_for_step(run, proc, 9)
    for pid in _pids_with_env(tag, "1"):
        os.kill(pid, signal.SIGKILL)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["restarts"] == 1 and summary["steps"] == 36
    assert _train_steps(run) == list(range(1, 37))  # every step logged once
    resumed = int(next(line for line in (run / "train.log").read_text().splitlines() if "resumed from" in line).split()[-1])
    assert resumed >= at_kill - 4  # at most one checkpoint interval was repeated


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(args, cwd):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master-port={_free_port()}"]
    return subprocess.run([*cmd, str(ROOT / "train.py"), *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # ~40 s: two torchrun generations of two workers each
def test_torchrun_restart_after_rank0_stopped_continues_in_its_dir(tmp_path):
    """torchrun --max-restarts=1: rank 0 alone is stopped at a known step (it exits through Python,
    as on an error of its own); the restarted group continues the same run dir from last.pt."""
    tag = uuid.uuid4().hex
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--max-restarts=1"]
    cmd += [f"--master-port={_free_port()}", str(ROOT / "train.py"), *DDP]
    env = {**os.environ, "TT_TEST_TAG": tag, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while not (runs := list((tmp_path / "outputs" / "train").glob("*/metrics.jsonl"))):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    run = runs[0].parent
    _wait_for_step(run, proc, 3)
    for pid in _pids_with_env(tag, "0"):
        os.kill(pid, signal.SIGTERM)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    assert [p.name for p in (tmp_path / "outputs" / "train").iterdir()] == [run.name]  # one run dir
    summary = json.loads((run / "summary.json").read_text())
    assert summary["restarts"] == 1 and summary["steps"] == 24
    assert _train_steps(run) == list(range(1, 25))  # continued from last.pt: every step logged once
    assert not any((tmp_path / "outputs" / ".torchrun").iterdir())  # the finished run's note is gone


@pytest.mark.slow  # real processes, ~20-70 s on a 2-core CPU: `python -m pytest -m slow`
def test_plain_torchrun_shares_one_dir_and_leaves_nothing_stale(tmp_path):
    """No --standalone: the rendezvous id is "none" for every run; a failed start must not
    steer the next run's ranks."""
    quick = ["distributed=ddp", "data=digits", "trainer.max_epochs=1", "trainer.limit_train_batches=4"]
    quick.append("trainer.progress_bar=false")
    bad = _torchrun([*quick, "optim.lr=-1"], tmp_path)
    assert bad.returncode != 0 and "optim.lr" in bad.stderr
    r = _torchrun(quick, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = [p for p in (tmp_path / "outputs" / "train").iterdir() if (p / "summary.json").is_file()]
    assert len(runs) == 1 and json.loads((runs[0] / "summary.json").read_text())["world_size"] == 2
    notes = tmp_path / "outputs" / ".torchrun"
    assert not notes.exists() or not list(notes.iterdir())


@pytest.mark.slow  # three launches of real processes, ~40 s on a 2-core CPU: `python -m pytest -m slow`
def test_two_torchrun_agents_are_one_run_equal_to_one_node_with_two_processes(tmp_path):
    """Several nodes, for real: two torchrun agents on 127.0.0.1 meet through a c10d rendezvous
    (the README's multi-node command with --nnodes=2 --nproc-per-node=1); they write one run dir,
    and train as one node with two processes does on the same global batch."""
    one = tmp_path / "one" / "run"
    args = (*EQUIV, "data.batch_size=32", "distributed=ddp")
    r = run_cli("train.py", *args, "distributed.nproc=2", f"hydra.run.dir={one}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    nodes = tmp_path / "nodes"
    nodes.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d"]
    cmd += [f"--rdzv-endpoint=127.0.0.1:{_free_port()}", f"--rdzv-id={uuid.uuid4().hex[:8]}", str(ROOT / "train.py"), *args]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    agents = [
        subprocess.Popen(cmd, cwd=nodes, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    for agent in agents:
        _, stderr = agent.communicate(timeout=300)
        assert agent.returncode == 0, stderr[-3000:]
    runs = list((nodes / "outputs" / "train").iterdir())
    assert len(runs) == 1  # one run dir for both nodes
    assert json.loads((runs[0] / "summary.json").read_text())["world_size"] == 2
    a, b = load(one / "checkpoints" / "last.pt"), load(runs[0] / "checkpoints" / "last.pt")
    assert a["state"]["global_step"] == b["state"]["global_step"] == 4
    for k, v in a["model"].items():
        torch.testing.assert_close(b["model"][k], v, rtol=1e-4, atol=1e-5, msg=k)
    assert abs(a["metrics"]["val_acc1"] - b["metrics"]["val_acc1"]) < 1e-9
