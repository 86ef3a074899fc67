"""DDP through real worker processes (gloo on CPU): equivalence, one run dir, failure handling."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch

from conftest import ROOT, make_cfg, run_cli
from turbotrain.config import ConfigError
from turbotrain.core.checkpoint import load
from turbotrain.train.collectives import balance_warning
from turbotrain.train.run import train

# BN-free and dropout-free, so 2 ranks x 32 samples must equal 1 rank x 64 samples exactly
# up to float summation order.
EQUIV = (
    "data=digits",
    "data.image_size=32",
    "model=resnet18",
    "model.name=squeezenet1_1",
    "model.dropout=0.0",
    "precision=fp32",
    "trainer.channels_last=false",
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=4",
    "trainer.progress_bar=false",
    "trainer.log_every_n_steps=1",
)


EMA = "trainer.ema_decay=0.5"  # the average follows the weights: equal too


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory) -> Path:
    """The reference: 1 process, 4 steps of 64 samples."""
    one = tmp_path_factory.mktemp("one") / "run"
    r = run_cli("train.py", *EQUIV, EMA, "data.batch_size=64", f"hydra.run.dir={one}", cwd=one.parent)
    assert r.returncode == 0, r.stderr[-2000:]
    return one


def _assert_same_weights(a: dict, b: dict) -> None:
    assert a["state"]["global_step"] == b["state"]["global_step"] == 4
    for k, v in a["model"].items():
        torch.testing.assert_close(b["model"][k], v, rtol=1e-4, atol=1e-5, msg=k)
    assert a["ema"]["updates"] == b["ema"]["updates"] == 4
    for k, v in a["ema"]["weights"].items():
        torch.testing.assert_close(b["ema"]["weights"][k], v, rtol=1e-4, atol=1e-5, msg=f"ema {k}")


def test_ddp_launched_here_with_accumulation_equals_one_process_on_same_global_batch(one_process_run, tmp_path, monkeypatch):
    """2 ranks x 2 micro-batches of 16: DDP must sync on each group's last micro-batch. With
    grad_accum_steps=1 first and last are one micro-batch, so only this run can tell them apart."""
    two = tmp_path / "run"
    args = (*EQUIV, EMA, "data.batch_size=16", "trainer.grad_accum_steps=2", "trainer.limit_train_batches=8")
    args += ("distributed=ddp", "distributed.nproc=2")
    monkeypatch.setattr(sys, "argv", [str(ROOT / "train.py")])  # the workers run the script that launched them
    best = train(make_cfg(*args), two, overrides=args)  # this process launches the workers, as train.py does
    one = load(one_process_run / "checkpoints" / "last.pt")
    _assert_same_weights(one, load(two / "checkpoints" / "last.pt"))
    assert best == json.loads((two / "summary.json").read_text())["best_val_acc1"]
    assert best == pytest.approx(one["metrics"]["val_acc1"], abs=1e-9)
    with pytest.raises(ConfigError, match="continue it with trainer.resume=auto"):  # a fresh job in a used dir:
        train(make_cfg(*args), two, overrides=args)  # refused before any launch
    fork = (*args, f"trainer.resume={one_process_run / 'checkpoints' / 'last.pt'}")
    with pytest.raises(ConfigError, match="starts a fork of that run.*fork into a new dir"):  # another run's
        train(make_cfg(*fork), two, overrides=fork)  # checkpoint continued in a used dir: refused as a fork


def test_two_process_ddp_equals_one_process_on_same_global_batch(one_process_run, tmp_path):
    one, two = one_process_run, tmp_path / "two" / "run"
    (tmp_path / "two").mkdir()
    r = run_cli(
        "train.py",
        *EQUIV,
        EMA,
        "data.batch_size=32",
        "distributed=ddp",
        "distributed.nproc=2",
        f"hydra.run.dir={two}",
        cwd=tmp_path / "two",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = load(one / "checkpoints" / "last.pt"), load(two / "checkpoints" / "last.pt")
    _assert_same_weights(a, b)
    # Validation is sharded across ranks and summed: the same figures as one process.
    assert b["metrics"]["val_samples"] == a["metrics"]["val_samples"] == 359
    assert abs(b["metrics"]["val_acc1"] - a["metrics"]["val_acc1"]) < 1e-9
    # One run dir, one writer: nothing else appeared beside it, every event is logged once.
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["run"]
    steps = [json.loads(line)["step"] for line in (two / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 4]  # four train events, one val event
    summary = json.loads((two / "summary.json").read_text())
    assert summary["world_size"] == 2 and len(summary["rank_peak_mem_mb"]) == 2
    rows = [list(r) for r in zip(summary["rank_peak_mem_mb"], summary["rank_epoch_time_s"], strict=True)]
    expected = balance_warning(rows, ("peak_mem_mb", "epoch_time_s"))  # the run's own rule, on its own figures
    assert ("ranks are unbalanced" in (two / "train.log").read_text()) == (expected is not None)


@pytest.mark.slow  # two worker processes decoding a JPEG tree: ~30 s on 2 cores
def test_one_rank_per_node_builds_the_decoded_cache(jpeg_tree, tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(jpeg_tree, tree)
    (tree / "train" / "china" / "broken.jpg").write_bytes(b"not a jpeg")  # the cache build warns about it
    r = run_cli(
        "train.py",
        "data=imagenet",
        f"data.root={tree}",
        "data.cache=raw",
        f"data.cache_dir={tmp_path / 'cache'}",
        "data.image_size=32",
        "data.batch_size=8",
        "model=small_cnn",
        "model.width=8",
        "distributed=ddp",
        "distributed.nproc=2",
        "trainer.max_epochs=1",
        "trainer.progress_bar=false",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    # rank 1 logs warnings too: a second build of the cache would warn a second time
    assert (r.stdout + r.stderr).count("data.cache: skipped 1 file(s)") == 1, r.stderr[-3000:]
    assert len(list((tmp_path / "cache").rglob("index.json"))) == 2  # one cache per split


def test_rank_balance_warning_names_the_spread():
    rows = [[1000.0, 10.0], [1050.0, 13.0]]  # memory 5 % apart, time 30 % apart
    warning = balance_warning(rows, ("peak_mem_mb", "epoch_time_s"))
    assert warning == "ranks are unbalanced: epoch_time_s 10.0..13.0 (30% apart)"
    assert balance_warning([[1000.0, 10.0], [1090.0, 10.5]], ("peak_mem_mb", "epoch_time_s")) is None


def _pids_with_env(tag: str, rank: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"TT_TEST_TAG={tag}".encode() in env and f"RANK={rank}".encode() in env:
            pids.append(int(proc.name))
    return pids


@pytest.mark.slow  # real processes, ~20-50 s on a 2-core CPU: `python -m pytest -m slow`
def test_killed_worker_fails_the_run_naming_the_rank(tmp_path):
    tag = uuid.uuid4().hex
    run = tmp_path / "run"
    args = [
        "data=digits",
        "distributed=ddp",
        "distributed.nproc=2",
        "distributed.timeout_s=30",
        "trainer.max_epochs=200",
        "trainer.progress_bar=false",
        f"hydra.run.dir={run}",
    ]
    env = {**os.environ, "TT_TEST_TAG": tag}
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text():
        assert proc.poll() is None and time.monotonic() < deadline, "training never started"
        time.sleep(0.2)
    victims = _pids_with_env(tag, "1")
    assert victims
    killed_at = time.monotonic()
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    _, stderr = proc.communicate(timeout=90)
    assert proc.returncode != 0
    assert time.monotonic() - killed_at < 60  # well within timeout_s + the launcher's grace
    assert "rank 1" in stderr and "signal 9" in stderr, stderr[-2000:]


def test_torchrun_ranks_share_one_run_dir(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(ROOT / "train.py"),
            "distributed=ddp",
            "data=digits",
            "trainer.max_epochs=1",
            "trainer.progress_bar=false",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    runs = list((tmp_path / "outputs" / "train").iterdir())
    assert len(runs) == 1 and (runs[0] / "summary.json").is_file()
    assert json.loads((runs[0] / "summary.json").read_text())["world_size"] == 2
    assert not list((tmp_path / "outputs" / ".torchrun").iterdir())
