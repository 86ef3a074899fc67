"""resume.changed_keys on its own, against changes written out by hand: which keys of a saved
config and a new one count as a change, and the values reported (the whole-run tests that a
resume refuses them are in test_resume.py and test_recipe.py; this one costs milliseconds)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from conftest import TINY, make_cfg
from turbotrain.config import ConfigError
from turbotrain.train.resume import changed_keys, check_config


def _saved(*overrides: str, edit=None) -> str:
    """A run's saved config (the checkpoint's yaml), optionally edited as a raw dict."""
    raw = OmegaConf.to_container(make_cfg(*TINY, *overrides), resolve=False)
    if edit:
        edit(raw)
    return yaml.safe_dump(raw)


def test_each_changed_numeric_key_is_reported_with_its_saved_and_new_value():
    new = make_cfg(*TINY, "data.batch_size=16", "trainer.grad_clip=2.5", "trainer.log_every_n_steps=7")
    assert changed_keys(_saved(), new) == [("data.batch_size", 64, 16), ("trainer.grad_clip", None, 2.5)]
    assert changed_keys(_saved(), make_cfg(*TINY)) == []


def test_a_key_the_saved_run_lacks_counts_as_its_default():
    def before_label_smoothing(raw):
        del raw["trainer"]["label_smoothing"]

    saved = _saved(edit=before_label_smoothing)
    assert changed_keys(saved, make_cfg(*TINY)) == []
    assert changed_keys(saved, make_cfg(*TINY, "trainer.label_smoothing=0.1")) == [("trainer.label_smoothing", 0.0, 0.1)]

    def before_the_precision_group(raw):  # a whole group added after the run, one with numeric keys
        del raw["precision"]

    assert changed_keys(_saved(edit=before_the_precision_group), make_cfg(*TINY)) == []


def test_a_value_typed_as_an_interpolation_is_compared_resolved():
    # the saved config holds resolved values: `${optim.lr}` is 0.1 there and here
    new = make_cfg(*TINY, "trainer.grad_clip=${optim.lr}")
    assert changed_keys(OmegaConf.to_yaml(new, resolve=True), new) == []
    assert changed_keys(_saved(), new) == [("trainer.grad_clip", None, 0.1)]


def test_a_key_only_the_saved_run_has_is_no_change():
    def with_retired_keys(raw):  # fields a later turbotrain dropped, numeric once or not
        raw["trainer"]["retired_knob"] = 3
        raw["optim"]["retired_beta"] = 0.5
        raw["retired_group"] = {"size": 4}

    assert changed_keys(_saved(edit=with_retired_keys), make_cfg(*TINY)) == []


def test_another_options_keys_are_judged_by_the_option_that_has_them():
    # sgd's momentum and nesterov are no adamw keys, adamw's betas and eps no sgd keys: in either
    # direction only what both options have counts (the name, and the values each sets for them)
    sgd, adamw = {"lr": 0.1, "name": "sgd", "weight_decay": 0.0005}, {"lr": 0.001, "name": "adamw", "weight_decay": 0.05}
    for old, new in ((sgd, adamw), (adamw, sgd)):
        expected = [(f"optim.{k}", old[k], new[k]) for k in sorted(old)]
        assert changed_keys(_saved(f"optim={old['name']}"), make_cfg(*TINY, f"optim={new['name']}")) == expected


def test_another_world_size_is_a_change_and_an_old_checkpoint_counts_as_one_process():
    path, cfg = Path("run/checkpoints/last.pt"), make_cfg(*TINY)
    with pytest.raises(ConfigError) as refused:
        check_config({"config": _saved(), "world_size": 2}, cfg, 1, path)
    assert str(refused.value) == (
        f"resuming {path} with a config that trains differently (world size: 2 -> 1): "
        "restore those values, or set trainer.resume_strict=false to continue anyway"
    )
    check_config({"config": _saved()}, cfg, 1, path)  # from before world_size was saved: one process
    with pytest.raises(ConfigError, match=r"\(world size: 1 -> 2\)"):
        check_config({"config": _saved()}, cfg, 2, path)


def test_a_change_allowed_by_resume_strict_false_is_said_in_one_warning(caplog):
    path, cfg = Path("run/checkpoints/last.pt"), make_cfg(*TINY, "trainer.resume_strict=false")
    with caplog.at_level("WARNING", logger="turbotrain"):
        check_config({"config": _saved(), "world_size": 2}, cfg, 1, path)
    assert [r.getMessage() for r in caplog.records] == [
        f"resuming {path} with a config that trains differently (world size: 2 -> 1); "
        "continuing because trainer.resume_strict=false"
    ]
