"""The registries are the one list of options: every option file has a registered builder and
every builder an option file, option files restate no schema default, and dispatch, error
messages and text-vs-image checks come from the registries."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from conftest import CONF, ROOT, make_cfg
from turbotrain.config import registries
from turbotrain.config.validation import validate
from turbotrain.core.schema import ConfigError

PRESETS = ("experiment", "hparams_search")  # presets of other groups' keys: no builder of their own
SRC = ROOT / "src" / "turbotrain"
assert (SRC / "train" / "loop.py").is_file(), SRC  # the checks below walk this tree: moved, they must fail


def _option_files() -> dict[str, list[Path]]:
    return {p.name: sorted(p.glob("*.yaml")) for p in CONF.iterdir() if p.is_dir() and p.name not in PRESETS}


def test_every_option_file_has_a_builder_and_every_builder_a_file():
    files = _option_files()
    assert set(files) == set(registries()), "each config group has a registry, and only those"
    for group, registry in registries().items():
        named = {yaml.safe_load(f.read_text())["name"] for f in files[group]}
        for name in named:
            registry[name]  # raises ConfigError for a file without a builder
        for option in registry:
            assert any(option.answers(n) for n in named), f"{group}={option.name} is registered but has no YAML file"


@pytest.mark.parametrize("path", [p for ps in _option_files().values() for p in ps], ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_option_file_names_its_schema_and_restates_no_default(path):
    group, text = path.parent.name, path.read_text()
    values = yaml.safe_load(text)
    option = registries()[group][values["name"]]
    assert values["defaults"] == [f"/schema/{group}/{option.name}@_here_", "_self_"]
    defaults = OmegaConf.to_container(OmegaConf.structured(option.schema))
    restated = [k for k, v in values.items() if k not in ("defaults", "name") and defaults.get(k) == v]
    assert not restated, f"{path.name} restates the schema defaults of {restated}: defaults live in the schema only"


def test_no_group_dispatch_by_name_outside_the_registries():
    # `cfg.<group>.name == ...` chains are how options used to be dispatched: one list per group now
    pattern = re.compile(r"\.name\s*(==|!=|in\b|not in\b)")
    offenders = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in SRC.rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line) and "registry" not in p.name
    ]
    assert not offenders, offenders


def test_init_files_only_re_export():
    for init in SRC.rglob("__init__.py"):
        tree = ast.parse(init.read_text())
        kinds = {type(node).__name__ for node in tree.body}
        assert kinds <= {"Expr", "Import", "ImportFrom", "Assign"}, f"{init}: {kinds}"


def test_modules_and_run_functions_stay_small():
    for p in SRC.rglob("*.py"):
        assert len(p.read_text().splitlines()) <= 300, f"{p.relative_to(ROOT)} is over 300 lines"
    for name in ("train/run.py", "train/session.py", "train/loop.py", "train/build.py"):
        tree = ast.parse((SRC / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                assert node.end_lineno - node.lineno + 1 <= 60, f"{name}:{node.name} is over 60 lines"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("optim.name=lion",), r"optim\.name='lion' is not supported; allowed: sgd, adam, adamw, rmsprop, adagrad"),
        (("sched.name=poly",), r"sched\.name='poly' is not supported; allowed: .*cosine"),
        (("data=digits", "compression=embed_lowrank"), None),
    ],
)
def test_unknown_names_list_the_registered_options(overrides, message):
    cfg = make_cfg(*overrides)
    if message is None:
        validate(cfg)  # a name that exists validates; its fit with the data is checked at build
        return
    with pytest.raises(ConfigError, match=message):
        validate(cfg)
