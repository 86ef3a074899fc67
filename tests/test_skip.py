"""Skipping a step with non-finite losses or gradients without reading the device each step: the
flag goes into the fused optimizer's kernel (as GradScaler's inf check does) and the counts are
read at log steps. Host reads are counted where they happen, in the loop's own code."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from test_loop import _data, _mlp, _run

LOOP = str(Path(__file__).resolve().parents[1] / "src" / "turbotrain" / "loop.py")


def _host_reads_from_the_loop(monkeypatch) -> list[str]:
    """Every bool()/item()/tolist() of a tensor called from loop.py, by name."""
    reads: list[str] = []
    for name in ("__bool__", "item", "tolist"):
        real = getattr(torch.Tensor, name)

        def spy(self, *args, _real=real, _name=name):
            if sys._getframe(1).f_code.co_filename == LOOP:
                reads.append(_name)
            return _real(self, *args)

        monkeypatch.setattr(torch.Tensor, name, spy)
    return reads


@pytest.mark.parametrize("check", ["loss", "grads"])
def test_host_reads_do_not_grow_with_the_steps(check, monkeypatch, tmp_path):
    """4 steps and 16 steps between two log points read the device equally often: no read per step."""
    reads = _host_reads_from_the_loop(monkeypatch)
    counts = []
    for n in (32, 128):
        x, y = _data(n)
        reads.clear()
        _run(_mlp(), x, y, batch_size=8, accum=1, tmp_path=tmp_path, log_every=10**6, overrides=(f"trainer.nan_check={check}",))
        counts.append(len(reads))
    assert counts[0] == counts[1], counts


def test_a_skipped_first_step_leaves_no_trace(tmp_path):
    """The fused SGD kernel starts its momentum on the first step; a first step skipped in the kernel
    must leave the run equal to one that never saw that batch."""
    x, y = _data(40)
    x[0, 0] = float("nan")  # the first batch of 8 is skipped
    skipped, clean = _mlp(), _mlp()
    state = _run(skipped, x, y, batch_size=8, accum=1, tmp_path=tmp_path)
    _run(clean, x[8:], y[8:], batch_size=8, accum=1, tmp_path=tmp_path)
    assert state.skipped_steps == 1 and state.global_step == 5
    for a, b in zip(skipped.parameters(), clean.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_patience_is_counted_across_log_points(tmp_path):
    """Consecutive skips are counted on the device between reads: the run still stops as diverged."""
    from turbotrain.train.loop import Diverged

    x, y = _data(64)
    x[:, 0] = float("nan")
    with pytest.raises(Diverged, match="3 consecutive steps"):
        _run(_mlp(), x, y, batch_size=8, accum=1, tmp_path=tmp_path, log_every=10**6, overrides=("trainer.nan_patience=3",))
