"""The Hydra entry point as a user meets it: --help, --cfg job, clean one-line errors."""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import logging
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import pytest

from conftest import CONF, ROOT, TINY, run_cli
from turbotrain.config import help_text


def test_help_lists_groups():
    r = run_cli("train.py", "--help")
    assert r.returncode == 0
    for group in ("data:", "model:", "precision:", "attention:", "compression:", "distributed:", "deploy:"):
        assert group in r.stdout


def _hydras_help(argv: list[str], config_name: str) -> str:
    """What Hydra's own `--help` prints (hydra.main's path, in this process)."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path, get_args_parser
    from hydra.core.global_hydra import GlobalHydra

    parser = get_args_parser()
    hydra = Hydra.create_main_hydra2(task_name=config_name, config_search_path=create_config_search_path(str(CONF)))
    try:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            hydra.app_help(config_name=config_name, args_parser=parser, args=parser.parse_args(argv))
    finally:
        GlobalHydra.instance().clear()
    return out.getvalue()


def test_our_help_prints_hydras_text_and_leaves_listings_and_other_flags_to_hydra():
    argv = ["--help", "--resolve", "model=resnet18", "trainer.seed=${data.batch_size}"]
    assert help_text(argv, CONF, "train", job_name="train") + "\n" == _hydras_help(argv, "train")
    argv = ["--help", "deploy=onnx_int8"]
    assert help_text(argv, CONF, "export", job_name="export") + "\n" == _hydras_help(argv, "export")
    listing = ["--help", "hydra.help.template=$APP_CONFIG_GROUPS"]  # a template with Hydra's own listing
    assert help_text(listing, CONF, "train", job_name="train") is None
    assert help_text(["--help", "--cfg", "job"], CONF, "train", job_name="train") is None  # a flag of Hydra's


def test_entry_points_freeze_their_imports_and_leave_the_collector_on():
    """train.py and export.py collect nothing during their imports and freeze what the imports
    made (no later collection, the exit's included, walks it); the collector is on again after."""
    code = (
        "import gc, runpy, sys\n"
        "for script in sys.argv[1:]:\n"
        "    gc.unfreeze()\n"
        "    runpy.run_path(script)\n"
        "    print(script, gc.isenabled(), gc.get_freeze_count())\n"
    )
    r = subprocess.run([sys.executable, "-c", code, "export.py", "train.py"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert len(lines) == 2, r.stdout
    for line in lines:
        script, enabled, frozen = line.split()
        assert enabled == "True" and int(frozen) > 100_000, line  # torch alone makes ~200,000


def test_cfg_job_prints_config():
    r = run_cli("train.py", "--cfg", "job", "model=resnet18")
    assert r.returncode == 0 and "name: resnet18" in r.stdout


@pytest.mark.slow  # real processes, ~20-70 s on a 2-core CPU: `python -m pytest -m slow`
def test_bad_values_exit_nonzero_with_one_line(tmp_path):
    r = run_cli("train.py", "optim.lr=-1", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 2
    assert "optim.lr=-1.0 must be > 0" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("train.py", "data=imagenet", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 2 and "data.root is required" in r.stderr and "Traceback" not in r.stderr


def test_unknown_option_and_key_fail_at_compose(tmp_path):
    r = run_cli("train.py", "model=resnet19", f"hydra.run.dir={tmp_path}")
    assert r.returncode != 0 and "resnet19" in r.stderr
    r = run_cli("train.py", "trainer.max_epoch=1", f"hydra.run.dir={tmp_path}")
    assert r.returncode != 0 and "max_epoch" in r.stderr


def test_a_refused_rerun_leaves_the_runs_hydra_files_as_they_were(tmp_path):
    r = run_cli("train.py", *TINY, "trainer.max_epochs=1", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 0, r.stderr[-2000:]
    hydra = tmp_path / ".hydra"
    before = {p.name: p.read_bytes() for p in hydra.iterdir()}
    assert set(before) == {"config.yaml", "hydra.yaml", "overrides.yaml"} and b"max_epochs=1" in before["overrides.yaml"]
    r = run_cli("train.py", *TINY, "trainer.max_epochs=2", "optim.lr=0.3", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 2 and "already holds a run" in r.stderr
    assert {p.name: p.read_bytes() for p in hydra.iterdir()} == before


def _train_into(path, tty: bool, *args: str) -> str:
    """train.py's stdout and stderr, both into a file (a SLURM .out file) or both on a terminal."""
    common = (*TINY, "trainer.max_epochs=1", "trainer.limit_train_batches=12", "trainer.progress_bar=true", *args)
    cmd = [sys.executable, str(ROOT / "train.py"), *common, f"hydra.run.dir={path}"]
    if not tty:
        with open(path.with_suffix(".txt"), "w") as out:
            subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=300, check=True)
        return path.with_suffix(".txt").read_text()
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 0 columns: tqdm draws nothing
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=secondary, stderr=secondary)
    os.close(secondary)
    chunks = []
    with contextlib.suppress(OSError):  # EIO: the process closed the terminal
        while chunk := os.read(primary, 65536):
            chunks.append(chunk)
    assert proc.wait(timeout=300) == 0
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.parametrize(
    ("start_step", "times", "expected"),
    [
        (0, {5: 10.0, 12: 24.0}, {5: "ETA 14 s", 12: "ETA 0 s"}),  # 2 s a step, 7 steps left at step 5
        (4, {5: 3.0, 8: 12.0, 12: 24.0}, {5: "ETA 21 s", 8: "ETA 12 s", 12: "ETA 0 s"}),  # resumed at 4: its own pace
    ],
)
def test_the_eta_is_the_remaining_steps_at_the_pace_so_far(start_step, times, expected, monkeypatch, caplog):
    from turbotrain.train import tracking

    clock = [0.0]
    monkeypatch.setattr(tracking.time, "monotonic", lambda: clock[0])
    lines = tracking.ProgressLines(start_step=start_step, total_steps=12, every_s=0.0)
    with caplog.at_level(logging.INFO, logger="turbotrain"):
        for step, seconds in times.items():
            clock[0] = seconds
            event = {"step": step, "epoch": 0, "loss": 1.0, "acc1": 0.5, "samples_per_s": 100.0}
            lines.train_event(event)
    got = {int(m[1]): m[2] for m in re.finditer(r"step (\d+)/12 .*?, (ETA .*)$", caplog.text, re.M)}
    assert got == expected


def test_off_a_terminal_progress_is_plain_lines_and_on_one_a_bar(tmp_path):
    logged = _train_into(tmp_path / "file", False, "trainer.progress_every_s=0")
    assert "\r" not in logged
    lines = re.findall(r"step (\d+)/12 \(epoch 0, (\d+)%\): loss [\d.]+, acc1 [\d.]+, \d+ samples/s, ETA \d+ s", logged)
    events = [json.loads(e) for e in (tmp_path / "file" / "metrics.jsonl").read_text().splitlines()]
    assert [int(s) for s, _ in lines] == [e["step"] for e in events if e["split"] == "train"] == [5, 10]
    assert [int(p) for _, p in lines] == [42, 83]
    shown = _train_into(tmp_path / "tty", True, "trainer.progress_every_s=0")
    assert re.search(r"\repoch 0: +\d+%", shown) and not re.search(r"step \d+/12 \(epoch", shown)  # a bar's frames
