"""Random override combinations from every group: each trains 2 steps or fails cleanly."""

from __future__ import annotations

import random

import pytest
from hydra.errors import ConfigCompositionException

from conftest import CONF, make_cfg
from turbotrain.errors import USER_ERRORS
from turbotrain.pipeline import train

GROUPS = {g.name: sorted(f.stem for f in g.glob("*.yaml")) for g in CONF.iterdir() if g.is_dir()}
SKIP_GROUPS = {"hparams_search", "distributed", "experiment", "data"}  # sweeps/processes: own tests
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
}


def _combo(rng: random.Random) -> list[str]:
    overrides = [f"{g}={rng.choice(opts)}" for g, opts in GROUPS.items() if g not in SKIP_GROUPS and rng.random() < 0.6]
    overrides += [f"{k}={rng.choice(v)}" for k, v in VALUES.items() if rng.random() < 0.3]
    return overrides


@pytest.mark.parametrize("seed", range(12))
def test_random_overrides_run_or_fail_cleanly(seed, tmp_path):
    rng = random.Random(seed)
    overrides = [
        *_combo(rng),
        "data=digits",
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
    except ConfigCompositionException as e:
        assert "Traceback" not in str(e)
        return
    try:
        best = train(cfg, tmp_path)
    except USER_ERRORS as e:
        assert len(str(e).splitlines()) == 1, str(e)
        return
    assert 0.0 <= best <= 1.0
