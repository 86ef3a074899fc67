"""Random override combinations from every group: each trains 2 steps or fails cleanly."""

from __future__ import annotations

import random
import re

import pytest
from hydra.errors import ConfigCompositionException

from conftest import CONF, make_cfg
from turbotrain.config.validation import validate
from turbotrain.core.errors import USER_ERRORS, report
from turbotrain.train.run import train

GROUPS = {g.name: sorted(f.stem for f in g.glob("*.yaml")) for g in CONF.iterdir() if g.is_dir()}
SKIP_GROUPS = {"hparams_search"}  # a sweep, not a run: tests/test_sweeps.py
SECTIONS = ("data", "model", "precision", "attention", "compression", "distributed", "deploy", "optim", "sched", "loader")
NAMES_A_KEY = re.compile(r"\b(" + "|".join((*SECTIONS, "logger", "profiler", "trainer")) + r")[.=]\w")
VALUES = {
    "optim.lr": ["0.05", "-1", "0", "abc"],
    "data.batch_size": ["8", "0", "16"],
    "trainer.grad_accum_steps": ["1", "2", "0"],
    "trainer.grad_clip": ["null", "1.0", "x"],
    "compression.flops_reduction": ["0.3", "1.5"],
    "compression.sparsity": ["0.5", "1.0"],
    "trainer.accum_bn": ["none", "freeze", "maybe"],
    "trainer.on_nan": ["skip", "stop", "retry"],
    "data.on_bad_sample": ["skip", "error", "ignore"],
    "sched.warmup_steps": ["0", "2"],
    "trainer.seed": ["0", "-1"],
    "trainer.threads": ["null", "0"],
    "trainer.nan_patience": ["5", "0"],
    "data.num_classes": ["10", "1"],
    "data.image_size": ["null", "0"],
    "data.eval_batch_size": ["null", "0"],
    "distributed.nproc": ["1", "0"],
    "distributed.max_restarts": ["0", "-1"],
    "deploy.calibration_batches": ["4", "-1"],
    "deploy.latency_repeats": ["3", "0"],
    "deploy.val_batches": ["null", "0"],
}


def _combo(rng: random.Random) -> list[str]:
    overrides = [f"{g}={rng.choice(opts)}" for g, opts in GROUPS.items() if g not in SKIP_GROUPS and rng.random() < 0.6]
    overrides += [f"{k}={rng.choice(v)}" for k, v in VALUES.items() if rng.random() < 0.3]
    return overrides


@pytest.mark.parametrize("seed", range(12))
def test_random_overrides_run_or_fail_cleanly(seed, tmp_path, capsys):
    rng = random.Random(seed)
    combo = _combo(rng)
    overrides = [
        *combo,
        *([] if any(o.startswith(("data=", "experiment=")) for o in combo) else ["data=digits"]),
        "model.width=8" if rng.random() < 0.5 else "model=small_cnn",
        "trainer.max_steps=2",
        "trainer.max_epochs=1",
        "trainer.limit_val_batches=1",
        "trainer.progress_bar=false",
        "logger.mode=disabled",
        "compression.from_run=null",
    ]
    try:
        cfg = make_cfg(*overrides)
    except ConfigCompositionException as e:  # a wrong type: Hydra names the override it could not merge
        assert NAMES_A_KEY.search(str(e)) and "could not be converted" in str(e).lower(), str(e)
        return
    try:
        if cfg.distributed.name == "ddp":
            validate(cfg)  # launching workers from pytest is tests/test_distributed.py's job
            return
        best = train(cfg, tmp_path)
    except USER_ERRORS as e:
        report(e)
        first = capsys.readouterr().err.splitlines()[0]
        assert first.startswith("error: ") and NAMES_A_KEY.search(first), first
        return
    assert 0.0 <= best <= 1.0


@pytest.mark.parametrize(
    "override",
    [
        "trainer.grad_clip=-1",
        "trainer.seed=-1",
        "trainer.threads=0",
        "trainer.nan_patience=0",
        "data.num_classes=1",
        "data.image_size=0",
        "data.eval_batch_size=0",
        "data.max_image_pixels=0",
        "deploy.calibration_batches=-1",
        "deploy.latency_repeats=0",
        "deploy.val_batches=0",
        "distributed.max_restarts=-1",
        "optim.momentum=1.5",
        "sched.min_lr_ratio=2",
        "optim.betas=[0.9,1.5]",
    ],
)
def test_bounded_key_is_named(override, capsys):
    with pytest.raises(USER_ERRORS) as e:
        validate(make_cfg(override))
    report(e.value)
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith(f"error: {override.split('=')[0]}="), first
