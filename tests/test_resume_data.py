"""resume.check_data on its own: each kind of change to a run's data named in the message, and
nothing said where the data is the run's (the whole-run test behind a jpeg tree is in
test_resume.py; this one costs milliseconds, so each mutant of the check meets it first)."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import checkpoint
from turbotrain.config import ConfigError
from turbotrain.train.resume import check_data, data_identity

PATH = Path("run/checkpoints/last.pt")
REFUSED = "its labels or epoch order are not the run's; restore the data, or set trainer.resume_strict=false to continue anyway"


def _data(names=("cat", "dog", "owl"), samples=12, files=None):
    files = {n: f"digest-{n}" for n in names} if files is None else files
    return SimpleNamespace(class_names=list(names), train=range(samples), class_files=files)


def _ckpt(data, with_identity=True):
    return checkpoint(arch={"class_names": list(data.class_names)}, data=data_identity(data) if with_identity else None)


def _refusal(ckpt, data) -> str:
    with pytest.raises(ConfigError) as refused:
        check_data(ckpt, data, PATH, strict=True)
    return str(refused.value)


def test_the_runs_own_data_passes_without_a_word(caplog):
    run = _data()
    with caplog.at_level(logging.DEBUG, logger="turbotrain"):
        for strict in (True, False):
            check_data(_ckpt(run), _data(), PATH, strict)
            check_data(_ckpt(run, with_identity=False), _data(), PATH, strict)  # a checkpoint from before `data`
            check_data(_ckpt(_data(files={})), _data(files={}), PATH, strict)  # text data: no files per class
    assert caplog.records == []


def test_each_change_is_named_with_its_old_and_new_value():
    run = _data()
    assert _refusal(_ckpt(run), _data(samples=11)) == f"resuming {PATH} on other data (training samples 12 -> 11): {REFUSED}"
    swapped = _data(files={"cat": "digest-cat", "dog": "digest-owl", "owl": "digest-dog"})
    assert _refusal(_ckpt(run), swapped) == (
        f"resuming {PATH} on other data (the files of class dog, owl changed (class folders swapped or renamed?)): {REFUSED}"
    )
    renamed = _data(names=("cat", "dog", "owls"))
    assert _refusal(_ckpt(run), renamed) == (
        f"resuming {PATH} on other data (classes ['cat', 'dog', 'owl'] -> ['cat', 'dog', 'owls']): {REFUSED}"
    )
    both = _data(names=("cat", "dog"), samples=8)
    assert _refusal(_ckpt(run), both) == (
        f"resuming {PATH} on other data (classes ['cat', 'dog', 'owl'] -> ['cat', 'dog']; training samples 12 -> 8): {REFUSED}"
    )


def test_files_are_compared_only_where_both_sides_have_them_and_nothing_else_changed():
    run = _data()
    check_data(_ckpt(run), _data(files={}), PATH, strict=True)  # this listing keeps no digests: not a change
    check_data(_ckpt(_data(files={})), _data(), PATH, strict=True)  # nor a checkpoint without them
    fewer = _data(samples=10, files={"cat": "other", "dog": "digest-dog", "owl": "digest-owl"})
    assert _refusal(_ckpt(run), fewer) == f"resuming {PATH} on other data (training samples 12 -> 10): {REFUSED}"


def test_not_strict_warns_with_the_same_reason_and_continues(caplog):
    with caplog.at_level(logging.WARNING, logger="turbotrain"):
        check_data(_ckpt(_data()), _data(samples=13), PATH, strict=False)
    assert [r.getMessage() for r in caplog.records] == [
        f"resuming {PATH} on other data (training samples 12 -> 13): its labels or epoch order are not the run's; "
        "continuing because trainer.resume_strict=false"
    ]
