"""SIGTERM wherever the run is: start-up, validation, pruning fine-tuning. A real signal is sent
to this process at the named point; the run must stop within a batch, keep what is worth keeping
and, resumed, equal an uninterrupted run."""

from __future__ import annotations

import os
import signal

import pytest

from conftest import TINY, make_cfg
from test_train import assert_same_run
from turbotrain.core.checkpoint import load
from turbotrain.train import session as pipeline
from turbotrain.train import surgery
from turbotrain.train.preemption import Preempted
from turbotrain.train.run import train

SHORT = (*TINY, "trainer.limit_train_batches=6")


def _signal_before(monkeypatch, module, name: str):
    """Send SIGTERM to this process just before `module.name` runs."""
    real = getattr(module, name)

    def wrapped(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapped)


def test_sigterm_during_validation_saves_the_epoch_and_resumes_exactly(tmp_path, monkeypatch):
    cfg = (*SHORT, "trainer.max_epochs=2")
    train(make_cfg(*cfg), tmp_path / "full")
    seen = []
    real = pipeline.evaluate

    def evaluate_signalled_in_epoch_1(*args, **kwargs):
        seen.append(1)
        if len(seen) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(pipeline, "evaluate", evaluate_signalled_in_epoch_1)
        with pytest.raises(Preempted, match="stopped by SIGTERM at step 12"):
            train(make_cfg(*cfg), tmp_path / "split")
    state = load(tmp_path / "split" / "checkpoints" / "last.pt")["state"]
    assert (state["epoch"], state["batch_in_epoch"], state["global_step"]) == (1, 6, 12)  # epoch 1 trained, not validated
    train(make_cfg(*cfg, "trainer.resume=auto"), tmp_path / "split")
    assert_same_run(tmp_path / "full", tmp_path / "split")


def test_sigterm_during_start_up_stops_before_training(tmp_path, monkeypatch):
    _signal_before(monkeypatch, pipeline, "build")
    with pytest.raises(Preempted, match="during start-up"):
        train(make_cfg(*SHORT, "trainer.max_epochs=50"), tmp_path)
    assert not (tmp_path / "checkpoints").exists()


def test_sigterm_during_pruning_fine_tuning_stops_within_a_step(tmp_path, monkeypatch):
    steps = []
    real = surgery.short_run

    def count_steps(*args, on_step=None, **kwargs):
        def on_step_counted(s):
            steps.append(s.global_step)
            if len(steps) == 1:
                os.kill(os.getpid(), signal.SIGTERM)
            on_step(s)

        return real(*args, on_step=on_step_counted, **kwargs)

    monkeypatch.setattr(surgery, "short_run", count_steps)
    cfg = make_cfg(
        *SHORT,
        "model=resnet18",
        "data.image_size=32",
        "compression=channel_prune",
        "compression.flops_reduction=0.3",
        "compression.steps=2",
        "compression.finetune_steps=50",
        "trainer.max_epochs=1",
    )
    with pytest.raises(Preempted, match="during pruning fine-tuning"):
        train(cfg, tmp_path)
    assert steps == [1]
