"""Hydra callback that writes sweep_summary.csv/.md at the multirun root when a sweep ends."""

from __future__ import annotations

import csv
import io
import json
import logging
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback

from turbotrain.core.atomic import atomic_write_text

log = logging.getLogger("turbotrain")
COLUMNS = ("job", "overrides", "best_val_acc1", "val_loss", "train_time_s", "samples_per_s", "status", "error")
ERROR_FILE = "error.txt"
_failed: list[str] = []  # jobs of this process's last sweep that failed (train.py's exit code)


class JobFailed(RuntimeError):
    """A sweep job failed; its error is in the job dir and the sweep summary."""


def record_failure(job_dir: Path, message: str) -> None:
    """A job's one-line error, for the sweep summary."""
    atomic_write_text(Path(job_dir) / ERROR_FILE, message + "\n")


def failed_jobs() -> list[str]:
    return list(_failed)


def collect(sweep_dir: Path) -> list[dict]:
    """One row per job dir (those with .hydra/overrides.yaml), best val top-1 first."""
    rows = []
    for job in sorted(p for p in sweep_dir.iterdir() if (p / ".hydra" / "overrides.yaml").is_file()):
        overrides = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text()) or []
        row = {"job": job.name, "overrides": " ".join(overrides), "status": "failed"}
        summary, error = job / "summary.json", job / ERROR_FILE
        if error.is_file():
            row["error"] = error.read_text().strip()
        elif summary.is_file():
            s = json.loads(summary.read_text())
            row.update({k: s.get(k) for k in COLUMNS[2:6]}, status="ok")
        rows.append(row)
    return sorted(rows, key=lambda r: -(r.get("best_val_acc1") or -1.0))


def write(sweep_dir: Path, rows: list[dict]) -> None:
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(sweep_dir / "sweep_summary.csv", table.getvalue())

    def cell(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v))

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in COLUMNS) + " |" for r in rows]
    atomic_write_text(sweep_dir / "sweep_summary.md", "\n".join(lines) + "\n")


class SweepSummary(Callback):
    """Rewrites the summary after every job, so it exists even when a sweeper gives up mid-way
    (Optuna raises at the end when no trial completed), and reports the failures at the end."""

    def on_job_end(self, config, job_return: Any = None, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if config.hydra.mode is not None and str(config.hydra.mode).endswith("MULTIRUN") and sweep_dir.is_dir():
            self._refresh(sweep_dir)

    def on_multirun_end(self, config, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        rows = self._refresh(sweep_dir)
        for r in rows:
            if r["status"] != "ok":
                log.error("job %s (%s) failed: %s", r["job"], r["overrides"], r.get("error", "no summary.json"))
        if rows:
            log.info(
                "sweep summary (%d jobs, best %s: %s) -> %s",
                len(rows),
                rows[0]["job"],
                rows[0]["overrides"],
                sweep_dir / "sweep_summary.md",
            )

    @staticmethod
    def _refresh(sweep_dir: Path) -> list[dict]:
        rows = collect(sweep_dir)
        write(sweep_dir, rows)
        _failed[:] = [r["job"] for r in rows if r["status"] != "ok"]
        return rows
