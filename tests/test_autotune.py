"""trainer.autotune: it picks the setting it measured fastest, leaves the numerics alone (same
weights as setting that choice by hand), and a resumed run keeps the first session's choice."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from conftest import TINY, make_cfg
from turbotrain.config import ConfigError
from turbotrain.config.validation import validate
from turbotrain.core.checkpoint import load
from turbotrain.train.autotune import apply_choice, candidates, choice_from_checkpoint
from turbotrain.train.resume import check_config
from turbotrain.train.run import train

# sched=none: the resumed session runs more epochs than the first planned, the LR must not care
TUNE = (
    *TINY,
    "sched=none",
    "trainer.autotune=true",
    "trainer.autotune_knobs=[channels_last,num_workers]",
    "loader.auto_candidates=[0,1]",
)


def test_autotune_picks_fastest_and_keeps_numerics(tmp_path):
    tuned = tmp_path / "tuned"
    train(make_cfg(*TUNE, "trainer.max_epochs=1"), tuned)
    first = json.loads((tuned / "summary.json").read_text())["autotune"]
    table = first["table"]
    # 2 layouts at the configured workers, then the other worker count at the better layout
    assert [(r["channels_last"], r["num_workers"]) for r in table[:2]] == [(False, 0), (True, 0)]
    assert len(table) == 3 and table[2]["num_workers"] == 1
    chosen = first["chosen"]
    row = next(r for r in table if (r["channels_last"], r["num_workers"]) == (chosen["channels_last"], chosen["num_workers"]))
    assert row["projected_run_s"] == min(r["projected_run_s"] for r in table)  # ties: any of the fastest
    saved = load(tuned / "checkpoints" / "last.pt")["config"]
    assert f"channels_last: {str(chosen['channels_last']).lower()}" in saved

    # resume: no new trials, the same choice
    train(make_cfg(*TUNE, "trainer.max_epochs=2", "trainer.resume=auto"), tuned)
    again = json.loads((tuned / "summary.json").read_text())["autotune"]
    assert again == {"chosen": chosen, "from_checkpoint": True}

    # the same run with the chosen setting picked by hand ends with the same weights
    by_hand = tmp_path / "by_hand"
    train(
        make_cfg(
            *TINY,
            "sched=none",
            "trainer.max_epochs=2",
            f"trainer.channels_last={chosen['channels_last']}",
            f"loader.num_workers={chosen['num_workers']}",
        ),
        by_hand,
    )
    a, b = load(tuned / "checkpoints" / "last.pt"), load(by_hand / "checkpoints" / "last.pt")
    assert a["metrics"] == b["metrics"]
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k


def test_tuned_loader_times_worker_counts_by_real_steps(tmp_path):
    """loader=tuned measures training steps (loading competes with the model for the cores)."""
    train(make_cfg(*TINY, "loader=tuned", "loader.auto_candidates=[0,1]", "trainer.max_epochs=1"), tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    table = summary["autotune"]["table"]
    assert sorted(r["num_workers"] for r in table) == [0, 1, 2]  # loader=tuned's configured 2, then the candidates
    assert {(r["channels_last"], r["compile"]) for r in table} == {(True, False)}  # nothing else changes
    assert summary["num_workers"] == summary["autotune"]["chosen"]["num_workers"]


@pytest.mark.slow  # real processes, ~20-50 s on a 2-core CPU: `python -m pytest -m slow`
def test_autotune_times_compile_as_a_candidate(tmp_path):
    """torch.compile is a real candidate: its compile time is its first-step cost."""
    train(make_cfg(*TINY, "trainer.max_epochs=1", "trainer.autotune=true", "trainer.autotune_knobs=[compile]"), tmp_path)
    table = json.loads((tmp_path / "summary.json").read_text())["autotune"]["table"]
    assert [r["compile"] for r in table] == [False, True]
    compiled = table[1]
    assert "error" not in compiled, compiled["error"]  # a broken torch.compile fails the test
    assert compiled["first_step_s"] > table[0]["first_step_s"]  # compilation is paid on the first step


def test_text_candidates_are_kernels_not_layouts():
    cfg = make_cfg("data=wordnet", "model=bert_tiny", "trainer.autotune=true")
    stage1, workers = candidates(cfg, "text", list(cfg.trainer.autotune_knobs))
    got = [(s["channels_last"], s["compile"], s["attention"]) for s in stage1]
    assert got == [(True, c, a) for c in (False, True) for a in ("sdpa", "eager")]  # layout stays as configured
    assert workers == [1, 2, 4]
    sliding = make_cfg("data=wordnet", "model=bert_tiny", "attention=sliding_window", "trainer.autotune=true")
    stage1, _ = candidates(sliding, "text", list(sliding.trainer.autotune_knobs))
    assert all("attention" not in s and "attention_kernel" not in s for s in stage1)  # a different function: not by default
    stage1, _ = candidates(sliding, "text", ["attention_kernel"])
    assert [s["attention_kernel"] for s in stage1] == ["sliding_window", "full"]  # the user allowed a different model


ATTENTION_SWAP = (
    "data=wordnet",
    "model=bert_tiny",
    "attention=sliding_window",
    "attention.window=4",
    "trainer.progress_bar=false",
    "trainer.limit_val_batches=2",
    "trainer.autotune=true",
    "trainer.autotune_steps=2",
    "trainer.autotune_knobs=[attention_kernel]",
)


def test_allowed_attention_kernel_swap_is_the_run_and_its_checkpoint(tmp_path):
    """trainer.autotune_knobs=[attention_kernel]: sliding window and full attention are timed; the
    run trains the one chosen, and its checkpoint says which (a resume keeps it)."""
    cfg = make_cfg(*ATTENTION_SWAP, "trainer.max_steps=8")
    train(cfg, tmp_path)
    tuned = json.loads((tmp_path / "summary.json").read_text())["autotune"]
    assert [r["attention_kernel"] for r in tuned["table"]] == ["sliding_window", "full"]
    chosen = tuned["chosen"]["attention_kernel"]
    ckpt = load(tmp_path / "checkpoints" / "last.pt")
    assert OmegaConf.create(ckpt["config"]).attention.name == chosen
    assert choice_from_checkpoint(ckpt)["attention_kernel"] == chosen
    # the command as typed, extended, resumes whichever kernel the first session chose (both checked)
    for kernel in ("full", "sliding_window"):
        first = make_cfg(*ATTENTION_SWAP, "trainer.max_steps=8")
        apply_choice(first, {**choice_from_checkpoint(ckpt), "attention_kernel": kernel})
        saved = {**ckpt, "config": OmegaConf.to_yaml(first, resolve=True)}
        check_config(saved, make_cfg(*ATTENTION_SWAP, "trainer.max_steps=12", "trainer.resume=auto"), 1, tmp_path)


def test_text_run_tunes_the_attention_kernel(tmp_path):
    cfg = make_cfg(
        "data=wordnet",
        "model=bert_tiny",
        "trainer.progress_bar=false",
        "trainer.max_steps=12",
        "trainer.limit_val_batches=2",
        "trainer.autotune=true",
        "trainer.autotune_steps=3",
        "trainer.autotune_knobs=[attention]",
    )
    train(cfg, tmp_path)
    tuned = json.loads((tmp_path / "summary.json").read_text())["autotune"]
    assert [r["attention"] for r in tuned["table"]] == ["sdpa", "eager"]
    saved = load(tmp_path / "checkpoints" / "last.pt")["config"]
    assert f"implementation: {tuned['chosen']['attention']}" in saved


def test_unknown_knob_is_named():
    with pytest.raises(ConfigError, match="trainer.autotune_knobs: unknown knob 'precision'"):
        validate(make_cfg(*TINY, "trainer.autotune=true", "trainer.autotune_knobs=[precision]"))
