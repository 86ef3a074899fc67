"""Continuing runs: a taken run dir, changed configs, extended schedules, best/last order, the
metrics log after a kill, a full disk."""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from conftest import CONF, ROOT, TINY, make_cfg
from test_train import assert_same_run
from turbotrain.config import ConfigError
from turbotrain.core import atomic
from turbotrain.core.atomic import WriteError
from turbotrain.core.checkpoint import load
from turbotrain.core.errors import one_line
from turbotrain.train import numerics
from turbotrain.train.run import train

SHORT = (*TINY, "trainer.limit_train_batches=6", "trainer.log_every_n_steps=1")


def _events(run_dir, split="train"):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["split"] == split]


def test_fresh_run_refuses_a_dir_that_holds_a_run(tmp_path):
    train(make_cfg(*SHORT, "trainer.max_epochs=1"), tmp_path)
    before = (tmp_path / "checkpoints" / "last.pt").read_bytes()
    with pytest.raises(ConfigError) as e:
        train(make_cfg(*SHORT, "trainer.max_epochs=1"), tmp_path)
    message = one_line(e.value)
    assert str(tmp_path) in message and "trainer.resume=auto" in message and "hydra.run.dir" in message
    assert (tmp_path / "checkpoints" / "last.pt").read_bytes() == before
    assert len(_events(tmp_path, "val")) == 1  # nothing appended


def test_default_run_dirs_are_unique():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        dirs = {compose("train", return_hydra_config=True).hydra.run.dir for _ in range(3)}
    assert len(dirs) == 3


@pytest.mark.parametrize("sched", ["cosine", "onecycle", "exponential"])
def test_extending_a_run_follows_the_longer_schedule(sched, tmp_path):
    """Resuming a 2-epoch run with max_epochs=4 gives, at every step after the resume, the LR an
    uninterrupted 4-epoch run has there (cosine: never 0 before the end)."""
    common = (*SHORT, f"sched={sched}")
    train(make_cfg(*common, "trainer.max_epochs=4"), tmp_path / "long")
    train(make_cfg(*common, "trainer.max_epochs=2"), tmp_path / "ext")
    train(make_cfg(*common, "trainer.max_epochs=4", "trainer.resume=auto"), tmp_path / "ext")
    reference = {e["step"]: e["lr"] for e in _events(tmp_path / "long")}
    extended = {e["step"]: e["lr"] for e in _events(tmp_path / "ext")}
    assert sorted(extended) == sorted(reference) == list(range(1, 25))
    for step in range(13, 25):
        assert extended[step] == pytest.approx(reference[step], rel=1e-12), step
    assert min(extended[s] for s in range(13, 24)) > 0
    assert load(tmp_path / "ext" / "checkpoints" / "last.pt")["state"]["global_step"] == 24


def test_resume_with_a_config_that_trains_differently_is_refused(tmp_path):
    train(make_cfg(*SHORT, "trainer.max_epochs=1"), tmp_path)
    changed = ("optim.lr=0.05", "data.batch_size=16", "trainer.seed=3")
    with pytest.raises(ConfigError) as e:
        train(make_cfg(*SHORT, *changed, "trainer.max_epochs=2", "trainer.resume=auto"), tmp_path)
    message = one_line(e.value)
    for key in ("optim.lr", "data.batch_size", "trainer.seed", "trainer.resume_strict=false"):
        assert key in message, key
    train(make_cfg(*SHORT, *changed, "trainer.max_epochs=2", "trainer.resume=auto", "trainer.resume_strict=false"), tmp_path)
    assert load(tmp_path / "checkpoints" / "last.pt")["state"]["epoch"] == 2


class Killed(BaseException):
    pass


def test_best_is_never_older_than_the_metrics(tmp_path, monkeypatch):
    """A kill between the two checkpoint files of an improving epoch: after the resume, best.pt
    holds the best validation figure of the run."""
    real_replace, writes = os.replace, []

    def replace(src, dst):
        if os.path.basename(os.path.dirname(dst)) == "checkpoints":
            writes.append(os.path.basename(dst))
            if len(writes) == 6:  # epoch 2's last.pt after its best.pt (each epoch: last.pt before validation, best, last)
                raise Killed
        real_replace(src, dst)

    cfg = (*SHORT, "optim.lr=0.02")
    with monkeypatch.context() as m:
        m.setattr(os, "replace", replace)
        with pytest.raises(Killed):
            train(make_cfg(*cfg, "trainer.max_epochs=2"), tmp_path)
    assert writes == ["last.pt", "best.pt", "last.pt", "last.pt", "best.pt", "last.pt"]  # epoch 2 improved
    train(make_cfg(*cfg, "trainer.max_epochs=2", "trainer.resume=auto"), tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    best = load(tmp_path / "checkpoints" / "best.pt")
    assert best["metrics"]["val_acc1"] == summary["best_val_acc1"] == max(e["acc1"] for e in _events(tmp_path, "val"))


def test_metrics_log_after_a_kill_reads_as_uninterrupted(tmp_path):
    cfg = (*SHORT, "trainer.checkpoint_every_n_steps=4", "sched=none")  # one LR whatever the horizon
    train(make_cfg(*cfg, "trainer.max_epochs=2"), tmp_path / "full")
    train(make_cfg(*cfg, "trainer.max_epochs=1"), tmp_path / "cut")
    metrics = tmp_path / "cut" / "metrics.jsonl"
    # the process went on past its checkpoint and was killed while writing a line
    metrics.write_text(metrics.read_text() + json.dumps({"step": 7, "split": "train", "lr": 1.0}) + '\n{"step": 8, "spl')
    train(make_cfg(*cfg, "trainer.max_epochs=2", "trainer.resume=auto"), tmp_path / "cut")
    strip = [{k: v for k, v in e.items() if k in ("step", "split", "loss", "lr")} for e in _events(tmp_path / "full")]
    again = [{k: v for k, v in e.items() if k in ("step", "split", "loss", "lr")} for e in _events(tmp_path / "cut")]
    assert again == strip


class FullDisk:
    """A file whose writes fail with ENOSPC once `room` bytes are written (the disk fills up)."""

    def __init__(self, f, room: int):
        self.f, self.room = f, room

    def write(self, data):
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def test_full_disk_during_checkpoint_keeps_last_and_says_so(tmp_path, monkeypatch):
    train(make_cfg(*SHORT, "trainer.max_epochs=1"), tmp_path)
    before = (tmp_path / "checkpoints" / "last.pt").read_bytes()
    real_open = open
    monkeypatch.setattr(atomic, "open", lambda p, mode="r": FullDisk(real_open(p, mode), 4096), raising=False)
    with pytest.raises(WriteError) as e:
        train(make_cfg(*SHORT, "trainer.max_epochs=2", "trainer.resume=auto"), tmp_path)
    monkeypatch.undo()
    name = "best.pt" if "best.pt" in str(e.value) else "last.pt"  # best.pt comes first when the epoch improved
    path = tmp_path / "checkpoints" / name
    kept = f"(the previous {name} was kept); free some space and resume"
    assert one_line(e.value) == f"could not write {path}: No space left on device {kept}"
    assert (tmp_path / "checkpoints" / "last.pt").read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["best.pt", "last.pt"]  # no temp left


@pytest.mark.cpu_path
def test_kill_9_mid_epoch_loses_at_most_the_clock_interval_and_resumes_exactly(tmp_path):
    """trainer.checkpoint_every_minutes: a SIGKILL (OOM killer, lost node) in the first epoch,
    before any epoch-end checkpoint, repeats at most the interval, and the resumed run equals
    the uninterrupted one."""
    minutes = 0.003
    common = (
        "data=digits",
        "data.batch_size=16",
        "model.width=16",
        "data.image_size=32",
        "trainer.max_epochs=1",
        "trainer.log_every_n_steps=1",
        "trainer.progress_bar=false",
        f"trainer.checkpoint_every_minutes={minutes}",
    )
    full, cut = tmp_path / "full", tmp_path / "cut"
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *common, f"hydra.run.dir={cut}"], cwd=tmp_path)
    deadline = time.monotonic() + 120
    # a fast machine logs 40 steps before the first interval has passed: wait for a clock save too
    while not ((cut / "checkpoints" / "last.pt").is_file() and (cut / "metrics.jsonl").is_file() and len(_events(cut)) >= 40):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    logged = _events(cut)  # what the killed process had done
    saved = load(cut / "checkpoints" / "last.pt")["state"]
    assert saved["epoch"] == 0 and 0 < saved["global_step"] <= logged[-1]["step"]  # a clock checkpoint
    gaps = [b["time"] - a["time"] for a, b in zip(logged, logged[1:])]
    at_save = next(e["time"] for e in logged if e["step"] == saved["global_step"])
    assert logged[-1]["time"] - at_save <= 60 * minutes + 2 * max(gaps)  # at most the interval (and its step) lost
    train(make_cfg(*common, "trainer.resume=auto"), cut)
    # the uninterrupted run on the killed process's own run-time choices (its timing of SGD's kernels)
    chosen = OmegaConf.create(load(cut / "checkpoints" / "last.pt")["config"])
    train(make_cfg(*common, *(f"{key}={OmegaConf.select(chosen, key)}" for key in numerics.AUTO)), full)
    assert_same_run(full, cut)


def _jpeg_run(root, run, *extra):
    cfg = ("data=imagenet", f"data.root={root}", "data.image_size=16", "data.batch_size=16", "model=small_cnn", "model.width=4")
    limits = ("trainer.limit_train_batches=1", "trainer.limit_val_batches=1", "trainer.progress_bar=false")
    train(make_cfg(*cfg, *limits, *extra), run)


def test_resume_on_swapped_class_folders_or_other_samples_is_refused(jpeg_tree, tmp_path):
    root, run = tmp_path / "tree", tmp_path / "run"
    shutil.copytree(jpeg_tree, root)
    _jpeg_run(root, run, "trainer.max_epochs=1")
    for split in ("train", "val"):  # the same class names and counts, the labels swapped
        (root / split / "china").rename(root / split / "tmp")
        (root / split / "flower").rename(root / split / "china")
        (root / split / "tmp").rename(root / split / "flower")
    resumed = ("trainer.max_epochs=2", "trainer.resume=auto")
    with pytest.raises(ConfigError, match=r"the files of class china, flower changed \(class folders swapped or renamed\?\)"):
        _jpeg_run(root, run, *resumed)
    next((root / "train" / "china").iterdir()).unlink()
    with pytest.raises(ConfigError, match=r"training samples 96 -> 95"):
        _jpeg_run(root, run, *resumed)
    _jpeg_run(root, run, *resumed, "trainer.resume_strict=false")  # said, and then allowed
    assert load(run / "checkpoints" / "last.pt")["state"]["epoch"] == 2
    old = sorted(p.name for p in (root / "train").iterdir())
    for split in ("train", "val"):  # a class renamed: other class names, the message says which
        (root / split / "flower").rename(root / split / "flowers")
    new = sorted(p.name for p in (root / "train").iterdir())
    with pytest.raises(ConfigError) as refused:
        _jpeg_run(root, run, "trainer.max_epochs=3", "trainer.resume=auto")
    assert str(refused.value) == (
        f"resuming {run / 'checkpoints' / 'last.pt'} on other data (classes {old} -> {new}): its labels or epoch order "
        "are not the run's; restore the data, or set trainer.resume_strict=false to continue anyway"
    )


def test_resuming_another_runs_checkpoint_forks_it_and_never_writes_over_a_run(tmp_path, caplog):
    train(make_cfg(*SHORT, "trainer.max_epochs=1"), tmp_path / "a")
    parent = tmp_path / "a" / "checkpoints" / "last.pt"
    before = {p.name: p.read_bytes() for p in (tmp_path / "a" / "checkpoints").iterdir()}
    train(make_cfg(*SHORT, "trainer.max_epochs=1"), tmp_path / "c")
    with pytest.raises(ConfigError, match=r"starts a fork of that run, and run dir .*c already holds a run"):
        train(make_cfg(*SHORT, "trainer.max_epochs=2", f"trainer.resume={parent}"), tmp_path / "c")
    with caplog.at_level("INFO", logger="turbotrain"):
        train(make_cfg(*SHORT, "trainer.max_epochs=2", f"trainer.resume={parent}"), tmp_path / "b")
    assert "learning rate at the resume step" in caplog.text
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["parent"] == str(parent)
    assert load(tmp_path / "b" / "checkpoints" / "last.pt")["state"]["global_step"] == 12  # continued from a's step 6
    assert {p.name: p.read_bytes() for p in (tmp_path / "a" / "checkpoints").iterdir()} == before  # a untouched
    train(make_cfg(*SHORT, "trainer.max_epochs=3", "trainer.resume=auto"), tmp_path / "b")  # the fork continues itself
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["parent"] == str(parent)


def test_which_keys_may_change_on_resume_is_each_schema_fields_own_word():
    from omegaconf import OmegaConf

    from turbotrain.train.resume import changed_keys

    saved = OmegaConf.to_yaml(make_cfg(*TINY))
    new = make_cfg(
        *TINY,
        "data.batch_size=16",  # a data key: numeric by its group's rule
        "data.eval_batch_size=7",  # numeric=False on its field
        "data.root=/elsewhere",  # numeric=False
        "optim.kernel=foreach",  # numeric=True on its field (the two kernels can differ in the last bit)
        "trainer.label_smoothing=0.1",  # numeric=True on a trainer field
        "trainer.log_every_n_steps=3",  # a trainer key: free by its group's rule
        "loader.num_workers=1",  # a group that never alters the numbers
    )
    assert [k for k, _, _ in changed_keys(saved, new)] == ["data.batch_size", "optim.kernel", "trainer.label_smoothing"]


# Every key whose change alters what a resumed run computes, written out by hand (the reference:
# a field that loses its numeric=True must fail here, not vanish from a list read off the schemas),
# with a value other than TINY's for each. optim.kernel is SGD's, precision.cpu_bf16 amp's.
REFUSED_ON_RESUME = {
    "trainer.limit_train_batches": 3,
    "trainer.grad_accum_steps": 2,
    "trainer.accum_bn": "freeze",
    "trainer.accum_bn_warmup_steps": 5,
    "trainer.grad_clip": 1.0,
    "trainer.seed": 3,
    "trainer.threads": 1,
    "trainer.label_smoothing": 0.1,
    "trainer.ema_decay": 0.9,
    "trainer.ema_every_n_steps": 2,
    "trainer.ema_warmup_steps": 4,
    "optim.kernel": "foreach",
    "precision.cpu_bf16": False,
}


def test_every_numeric_setting_is_refused_on_resume_and_the_list_is_complete():
    import dataclasses

    from omegaconf import OmegaConf

    from turbotrain.config.schemas import TrainerConfig, registries
    from turbotrain.train.resume import changed_keys

    base = (*TINY, "optim=sgd", "precision=amp")
    saved = OmegaConf.to_yaml(make_cfg(*base))
    for key, value in REFUSED_ON_RESUME.items():
        assert [k for k, _, _ in changed_keys(saved, make_cfg(*base, f"{key}={value}"))] == [key], key
    flagged = {f"trainer.{f.name}" for f in dataclasses.fields(TrainerConfig) if f.metadata.get("numeric")}
    for group, registry in registries().items():
        flagged |= {f"{group}.{f.name}" for o in registry for f in dataclasses.fields(o.schema) if f.metadata.get("numeric")}
    assert flagged == set(REFUSED_ON_RESUME)  # a new numeric field: add it above, with a value to change it to


def _draws() -> tuple:
    return torch.rand(3).tolist(), np.random.normal(size=3).tolist(), [random.random() for _ in range(3)]


def test_every_rng_continues_from_a_saved_checkpoint_as_if_never_stopped(tmp_path):
    """torch, numpy (with a Gaussian cached: normal() draws in pairs) and Python's random, saved in
    a real checkpoint file and loaded back, continue with the draws the uninterrupted streams make."""
    from turbotrain.core.checkpoint import atomic_save, rng_state, set_rng_state

    torch.manual_seed(3), np.random.seed(4), random.seed(5)
    _draws()  # an odd count of normals: the state holds a cached Gaussian
    atomic_save({"rng": rng_state()}, tmp_path / "rng.pt")
    uninterrupted = _draws()
    torch.manual_seed(0), np.random.seed(0), random.seed(0)  # what the process did meanwhile
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True)["rng"])
    assert _draws() == uninterrupted


def test_each_rank_resumes_its_own_rng_streams_and_old_checkpoints_give_rank_0s():
    """payload keeps every rank's RNG state; rank_rng hands rank r its own (a 2-rank job's rank 1
    must not repeat rank 0's augmentation), and a checkpoint from before per-rank states (`rng`
    alone) or from fewer ranks gives rank 0's."""
    from turbotrain.core.checkpoint import payload, rank_rng, rng_state

    states = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        states.append(rng_state())
    model = torch.nn.Linear(2, 2)
    parts = {"optimizer": torch.optim.SGD(model.parameters()), "scheduler": None, "scaler": None, "state": {}}
    ckpt = payload(state_dict=model.state_dict(), **parts, config_yaml="", arch={}, metrics={}, rng=states)
    assert all(torch.equal(rank_rng(ckpt, r)["torch"], states[r]["torch"]) for r in (0, 1))
    assert not torch.equal(states[0]["torch"], states[1]["torch"])
    assert ckpt["rng"] is states[0] and ckpt["world_size"] == 2  # the format's rank-0 field, read by older versions
    assert torch.equal(rank_rng(ckpt, 2)["torch"], states[0]["torch"])  # more ranks than saved: rank 0's
    old = {"rng": states[1]}  # format without rng_ranks
    assert all(rank_rng(old, r) is states[1] for r in (0, 1))
