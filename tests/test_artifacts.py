"""What an export may read and write: only inside its run, only checkpoints turbotrain could have
written, no secrets and no absolute paths of the machine that built it."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from conftest import ROOT, TINY, make_cfg, run_cli
from turbotrain.config import ConfigError
from turbotrain.core.checkpoint import CheckpointError, load
from turbotrain.deploy.export import checkpoint_file, export
from turbotrain.train.run import train


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("outputs") / "run"
    train(make_cfg(*TINY, "trainer.max_epochs=1"), run)
    return run


def _export_cfg(run: Path, *extra: str):
    return make_cfg(f"run={run}", "deploy=fp32", "deploy.latency_repeats=3", "deploy.val_batches=2", *extra, config_name="export")


@pytest.mark.parametrize("link", ["export", "export/fp32"])
def test_export_through_a_symlink_out_of_the_run_is_refused(run, tmp_path, link):
    # its own copy, without the exports other tests may have made in the shared run (whichever ran
    # first: the mutation job orders tests by cost): an export/ there would block the link
    run = Path(shutil.copytree(run, tmp_path / "run", ignore=shutil.ignore_patterns("export")))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    path = run / link
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(ConfigError, match="leads outside the run dir"):
        export(_export_cfg(run))
    assert list(elsewhere.iterdir()) == []


def test_checkpoint_is_best_last_or_a_file_inside_the_run(run, tmp_path):
    assert checkpoint_file(run, "last") == run / "checkpoints" / "last.pt"
    assert checkpoint_file(run, "checkpoints/best.pt") == run / "checkpoints" / "best.pt"
    outside = tmp_path / "best.pt"
    outside.write_bytes((run / "checkpoints" / "best.pt").read_bytes())
    for name in (str(outside), "../../" + outside.name, f"checkpoints/../../{run.parent.name}/x.pt"):
        with pytest.raises(ConfigError, match="must be best, last or a file inside the run dir"):
            checkpoint_file(run, name)
    with pytest.raises(ConfigError, match="needs its run"):
        export(make_cfg(f"checkpoint={outside}", config_name="export"))


def _tampered(run: Path, tmp_path: Path, change) -> Path:
    ckpt = load(run / "checkpoints" / "best.pt")
    change(ckpt)
    path = tmp_path / "tampered.pt"
    torch.save(ckpt, path)
    return path


TAMPER = {
    "config interpolation": (
        lambda c: c.update(config=c["config"] + "stolen: ${oc.env:HOME}\n"),
        "config holds an interpolation",
    ),
    "arch interpolation": (lambda c: c["arch"]["class_names"].__setitem__(0, "${oc.env:HOME}"), "arch.class_names"),
    "huge num_classes": (lambda c: c["arch"].update(num_classes=10**9), "arch.num_classes=1000000000 is outside"),
    "huge image": (lambda c: c["arch"].update(image_size=10**6), "arch.image_size"),
    "model width": (lambda c: c["arch"]["model"].update(width=10**7), "arch.model.width"),
    "text model for images": (lambda c: c["arch"]["model"].update(name="hf"), "does not fit arch.kind='image'"),
    "model path": (lambda c: c["arch"]["model"].update(path="../../../../somewhere/else"), "arch.model.path"),
    "pruned groups": (lambda c: c["arch"].update(conv_groups={"0.0": 10**8}), "arch.conv_groups"),
}


@pytest.mark.parametrize("case", list(TAMPER))
def test_checkpoint_fields_are_data_and_bounded(run, tmp_path, case):
    change, needle = TAMPER[case]
    path = _tampered(run, tmp_path, change)
    with pytest.raises(CheckpointError, match="is refused") as refused:
        load(path)
    assert needle in str(refused.value)


def test_checkpoint_without_arch_is_one_clear_error(run, tmp_path):
    from turbotrain.models import from_checkpoint

    path = _tampered(run, tmp_path, lambda c: c.pop("arch"))
    with pytest.raises(CheckpointError, match="has no arch entry"):
        from_checkpoint(load(path), path)


def test_export_report_carries_no_absolute_paths(run):
    out = export(_export_cfg(run))
    report = json.loads((out / "report.json").read_text())
    assert (report["run"], report["checkpoint"]) == (run.name, "checkpoints/best.pt")
    for name in ("report.json", "README.txt"):
        text = (out / name).read_text()
        for absolute in (str(run.parent), str(ROOT), sys.prefix, str(Path.home())):
            assert absolute not in text, (name, absolute)


SENTINELS = {  # wandb checks the shape of its key: 40 characters
    "WANDB_API_KEY": "sentinelwandb" + "4" * 27,
    "HF_TOKEN": "hf_sentinel4242hf",
    "MY_SECRET": "sentinel-mine-4242",
}


def test_secrets_never_land_on_disk_and_wandb_logs_offline(tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, **SENTINELS, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    args = (*TINY, "trainer.max_epochs=1", "logger=wandb", "logger.mode=offline", f"hydra.run.dir={run}")
    r = run_cli("train.py", *args, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_cli("export.py", "deploy=int8", f"run={run}", "deploy.latency_repeats=3", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    logs = list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(logs) == 1 and b"val/acc1" in logs[0].read_bytes()  # wandb really logged the run, offline
    assert (run / "export" / "int8" / "model.pt") in written
    for path in written:
        data = path.read_bytes()
        for name, value in SENTINELS.items():
            assert value.encode() not in data, f"{name} leaked into {path.relative_to(tmp_path)}"


def test_saved_config_round_trips_as_plain_data(run):
    config = OmegaConf.create(load(run / "checkpoints" / "best.pt")["config"])
    assert "${" not in OmegaConf.to_yaml(config)
