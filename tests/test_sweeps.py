"""Multirun with the basic launcher, an Optuna search, and the SLURM launcher config."""

from __future__ import annotations

import csv

import pytest
from hydra import compose, initialize_config_dir

from conftest import CONF, run_cli

QUICK = ("data=digits", "model.width=8", "trainer.max_epochs=1", "trainer.progress_bar=false")


def _rows(sweep_dir):
    with open(sweep_dir / "sweep_summary.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow  # the failed-job sweep test also runs a multirun and reads its summary
def test_four_job_multirun_writes_sorted_summary(tmp_path):
    sweep = tmp_path / "sweep"
    r = run_cli(
        "train.py",
        "-m",
        "optim.lr=0.1,0.01",
        "sched=cosine,onecycle",
        *QUICK,
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = _rows(sweep)
    assert len(rows) == 4 and {row["status"] for row in rows} == {"ok"}
    accs = [float(row["best_val_acc1"]) for row in rows]
    assert accs == sorted(accs, reverse=True)
    assert all((sweep / row["job"] / "summary.json").is_file() for row in rows)
    assert "optim.lr=0.01" in (sweep / "sweep_summary.md").read_text()


def test_failed_job_is_recorded_and_the_sweep_goes_on(tmp_path):
    sweep = tmp_path / "sweep"
    r = run_cli("train.py", "-m", "optim.lr=0.1,-1,0.05", *QUICK, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode != 0
    rows = {row["overrides"]: row for row in _rows(sweep)}
    assert len(rows) == 3
    failed = next(row for o, row in rows.items() if "optim.lr=-1" in o)
    assert failed["status"] == "failed" and "optim.lr=-1" in failed["error"] and "must be > 0" in failed["error"]
    assert sorted(row["status"] for row in rows.values()) == ["failed", "ok", "ok"]
    assert "must be > 0" in (sweep / "sweep_summary.md").read_text()


@pytest.mark.slow  # ~25 s: submitit's local launcher starts a process per job
def test_submitit_runs_each_job_in_a_process_of_its_own(tmp_path):
    """The SLURM path through Hydra's submitit launcher, for real on this machine
    (hydra/launcher=submitit_local): each job runs train.py's main in a fresh process, which must
    load the options itself; both jobs train and the summary is written."""
    sweep = tmp_path / "sweep"
    args = ("-m", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=5", "optim.lr=0.1,0.05", *QUICK)
    r = run_cli("train.py", *args, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = _rows(sweep)
    assert len(rows) == 2 and {row["status"] for row in rows} == {"ok"}, rows
    assert all(float(row["best_val_acc1"]) > 0.3 for row in rows)  # trained (10 classes: chance is 0.1)


@pytest.mark.slow  # real processes, ~20-70 s on a 2-core CPU: `python -m pytest -m slow`
def test_optuna_trial_that_fails_is_reported_and_the_study_goes_on(tmp_path):
    sweep = tmp_path / "optuna"
    r = run_cli(
        "train.py",
        "hparams_search=optuna",
        "hydra.sweeper.n_trials=4",
        "trainer.grad_accum_steps=choice(0,1)",  # trial 0 draws 0 (seeded sampler): it fails
        *QUICK,
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    rows = _rows(sweep)
    assert len(rows) == 4, r.stderr[-3000:]
    statuses = sorted(row["status"] for row in rows)
    assert "failed" in statuses and "ok" in statuses, statuses
    assert r.returncode != 0
    assert "best_value" in (sweep / "optimization_results.yaml").read_text()


@pytest.mark.slow  # ~20 s each: the Optuna config is checked at compose time in test_config.py
@pytest.mark.parametrize("search", ["optuna", "random"])
def test_optuna_search_runs_four_trials(search, tmp_path):
    sweep = tmp_path / "optuna"
    r = run_cli(
        "train.py",
        f"hparams_search={search}",
        "hydra.sweeper.n_trials=4",
        *QUICK,
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(_rows(sweep)) == 4
    assert "best_value" in (sweep / "optimization_results.yaml").read_text()


def test_slurm_launcher_config_composes():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=["hydra/launcher=submitit_slurm", "hydra.launcher.gpus_per_node=8", "distributed=ddp"],
            return_hydra_config=True,
        )
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher")
    assert cfg.hydra.launcher.gpus_per_node == 8
