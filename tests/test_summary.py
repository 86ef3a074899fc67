"""summary.json where a figure has no rate to give: an fp32 run (no autocast dtype) and a resume
that finds nothing left to train (no samples in this session)."""

from __future__ import annotations

import json

from conftest import TINY, make_cfg
from turbotrain.train.run import train


def test_a_resume_with_nothing_left_writes_the_runs_summary_without_this_sessions_rates(tmp_path):
    overrides = (*TINY, "trainer.max_epochs=1", "precision=fp32")
    best = train(make_cfg(*overrides), tmp_path)
    first = json.loads((tmp_path / "summary.json").read_text())
    assert first["autocast_dtype"] is None and first["precision"] == "fp32"
    assert train(make_cfg(*overrides, "trainer.resume=auto"), tmp_path) == best
    again = json.loads((tmp_path / "summary.json").read_text())
    assert (again["samples_per_s"], again["data_wait_frac"]) == (None, None)
    assert (again["best_val_acc1"], again["steps"], again["epochs"]) == (first["best_val_acc1"], first["steps"], 1)
