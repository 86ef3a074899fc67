"""Run tracking: metrics.jsonl, summary.json, progress (a bar, or plain lines off a terminal), and the
logger option (loggers.py).

Only the main rank gets an active Tracker; other ranks get one with
`enabled=False`, which writes nothing.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from turbotrain.core.atomic import atomic_write_text
from turbotrain.train.loggers import LOGGERS

log = logging.getLogger("turbotrain")

METRIC_KEYS = (
    "step",
    "epoch",
    "split",
    "loss",
    "acc1",
    "acc5",
    "lr",
    "samples_per_s",
    "data_wait_frac",
    "peak_mem_mb",
)


def peak_mem_mb(device: torch.device) -> float:
    """CUDA: the caching allocator's peak; CPU: the process's resident-set high-water mark."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def start_ticks(pid: int | str = "self") -> int:
    """When a process started, in clock ticks since boot (Linux /proc)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def process_age_s() -> float:
    """Seconds since this process started, imports included: start-up cost."""
    boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime"))
    return time.time() - (boot + start_ticks() / os.sysconf("SC_CLK_TCK"))


def gpu_util(device: torch.device) -> float | None:
    """CUDA: the GPU's utilization (%) over the driver's last sample period (NVML, from
    nvidia-ml-py: turbotrain[gpu]); None on CPU, where data_wait_frac is the analogue."""
    if device.type != "cuda":
        return None
    try:
        return float(torch.cuda.utilization(device))
    except Exception as e:  # nvidia-ml-py missing or the driver refuses: no figure, not a failed run
        missing = isinstance(e, ModuleNotFoundError)
        _no_gpu_util(f"{type(e).__name__}: {e}" + ("; pip install 'turbotrain[gpu]' installs nvidia-ml-py" if missing else ""))
        return None


@functools.cache  # once per process and reason, not at every log step
def _no_gpu_util(why: str) -> None:
    log.warning("gpu_util is null in metrics: NVML failed (%s)", why)


def _clean(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf
    return value


def trim_metrics(run_dir: Path, upto_step: int) -> int:
    """Before a resumed run appends to metrics.jsonl: drop a partial last line (the previous
    process was killed mid-write) and the events after the checkpoint's step (the resumed run logs
    them again), so the file reads as if the run had never stopped. Returns the lines dropped."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text().splitlines(keepends=True):
        try:
            event = json.loads(line) if line.endswith("\n") else None
        except json.JSONDecodeError:
            event = None
        if event is None or event.get("step", 0) > upto_step:
            dropped += 1
        else:
            kept.append(line)
    if dropped:
        atomic_write_text(path, "".join(kept))
    return dropped


def duration(seconds: float) -> str:
    """`45 s`, `2 min 05 s`, `1 h 02 min`: an ETA a person reads."""
    minutes, s = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {s:02d} s" if minutes else f"{s} s"


class ProgressLines:
    """Progress off a terminal (a SLURM .out file, `python train.py > log`): a plain log line from
    the train events every `every_s` seconds (and at the run's last step, where it logs one),
    instead of a bar's carriage-return frames. The ETA is the whole run's, at this session's pace so far."""

    def __init__(self, start_step: int, total_steps: int, every_s: float) -> None:
        self.start_step, self.total_steps, self.every_s = start_step, total_steps, every_s
        self.start, self.last = time.monotonic(), -math.inf

    def train_event(self, event: dict) -> None:
        now, step = time.monotonic(), event["step"]
        if now - self.last < self.every_s and step < self.total_steps:
            return
        self.last = now
        pace = (now - self.start) / max(1, step - self.start_step)
        loss, acc1 = (f"{v:.4f}" if isinstance(v, float) else v for v in (event["loss"], event["acc1"]))  # "nan": a string
        log.info(
            "step %d/%d (epoch %d, %.0f%%): loss %s, acc1 %s, %.0f samples/s, ETA %s",
            *(step, self.total_steps, event["epoch"], 100 * step / self.total_steps, loss, acc1),
            *(event["samples_per_s"], duration(pace * (self.total_steps - step))),
        )


class Tracker:
    def __init__(
        self,
        run_dir: Path,
        *,
        enabled: bool,
        logger_cfg,
        config: dict,
        progress_bar: bool = True,
        steps: tuple[int, int] | None = None,
        progress_every_s: float = 30.0,
    ) -> None:
        """`progress_bar`: a tqdm bar where stderr is a terminal, and ProgressLines of the run's
        `steps` (first, total) where stdout is not."""
        self.run_dir, self.enabled = Path(run_dir), enabled
        self.progress_bar = progress_bar and enabled and sys.stderr.isatty()
        self._lines = None
        if progress_bar and enabled and steps is not None and not sys.stdout.isatty():
            self._lines = ProgressLines(*steps, progress_every_s)
        self._logger = None
        self._file = None
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._file = open(self.run_dir / "metrics.jsonl", "a", buffering=1)  # noqa: SIM115 (closed in close())
        self._logger = LOGGERS.of(logger_cfg).build(logger_cfg, self.run_dir, config)

    def log(self, **event: Any) -> None:
        if not self.enabled:
            return
        event = {k: _clean(v) for k, v in event.items()}
        event["time"] = round(time.time(), 3)
        try:
            self._file.write(json.dumps(event) + "\n")
        except OSError as e:  # a full disk: name the file (a file object's write error does not)
            raise OSError(e.errno, e.strerror, self._file.name) from e
        if self._logger is not None:
            self._logger.log(event)
        if self._lines is not None and event["split"] == "train":
            self._lines.train_event(event)

    def bar(self, total: int | None, desc: str, done: int = 0) -> tqdm:
        """`done` of `total` already behind it (a resumed epoch): its rate counts this session's alone."""
        return tqdm(
            total=total,
            initial=done,
            desc=desc,
            disable=not self.progress_bar,
            dynamic_ncols=True,
            leave=False,
            file=sys.stderr,
        )

    def summary(self, summary: dict) -> None:
        if not self.enabled:
            return
        summary = {k: _clean(v) for k, v in summary.items()}
        atomic_write_text(self.run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
        if self._logger is not None:
            self._logger.summary(summary)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._logger is not None:
            self._logger.close()
            self._logger = None
