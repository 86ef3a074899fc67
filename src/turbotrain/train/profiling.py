"""profiler=torch: torch.profiler over a window of optimizer steps, written into the run dir.

Writes <run>/profiler/trace.json (chrome://tracing, Perfetto), a TensorBoard trace
(<run>/profiler/tb/, `tensorboard --logdir`) and top_ops.txt (the 20 most expensive ops).
With profiler=none nothing is created and the training loop pays nothing.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

from turbotrain.core.registry import Registry
from turbotrain.core.schema import NON_NEGATIVE, POSITIVE, setting

log = logging.getLogger("turbotrain")


PROFILERS = Registry("profiler")


@dataclass
class ProfilerConfig:
    name: str = "none"  # the option (profiler=<name>)


@dataclass
class TorchProfilerConfig(ProfilerConfig):
    wait: int = setting(5, bound=NON_NEGATIVE)  # optimizer steps skipped,
    warmup: int = setting(2, bound=NON_NEGATIVE)  # then warmed up,
    active: int = setting(5, bound=POSITIVE)  # then traced, once
    record_shapes: bool = False  # record each op's input shapes
    profile_memory: bool = True  # record tensor allocations


@contextlib.contextmanager
def profiler(cfg, run_dir: Path, device: torch.device, enabled: bool) -> Iterator[Callable[[], None] | None]:
    """Yields a per-optimizer-step callback, or None when profiling is off (or not rank 0)."""
    if not enabled:
        yield None
        return
    with PROFILERS.of(cfg).build(cfg, Path(run_dir), device) as step:
        yield step


@PROFILERS.register("none", ProfilerConfig)
@contextlib.contextmanager
def no_profiler(cfg, run_dir: Path, device: torch.device) -> Iterator[None]:
    yield None


@PROFILERS.register("torch", TorchProfilerConfig)
@contextlib.contextmanager
def torch_profiler(cfg, run_dir: Path, device: torch.device) -> Iterator[Callable[[], None]]:
    """torch.profiler over a few optimizer steps: TensorBoard trace, trace.json, top_ops.txt."""
    out = Path(run_dir) / "profiler"
    out.mkdir(parents=True, exist_ok=True)
    tensorboard = tensorboard_trace_handler(str(out / "tb"))

    def on_ready(prof) -> None:
        tensorboard(prof)  # a chrome trace can be exported once: TensorBoard's file doubles as trace.json
        newest = max((out / "tb").glob("*.pt.trace.json"), key=lambda p: p.stat().st_mtime)
        shutil.copyfile(newest, out / "trace.json")
        sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
        (out / "top_ops.txt").write_text(prof.key_averages().table(sort_by=sort, row_limit=20) + "\n")
        log.info("profiler: %d steps traced -> %s", cfg.active, out)

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(
        activities=activities,
        schedule=schedule(wait=cfg.wait, warmup=cfg.warmup, active=cfg.active, repeat=1),
        on_trace_ready=on_ready,
        record_shapes=cfg.record_shapes,
        profile_memory=cfg.profile_memory,
    ) as prof:
        yield prof.step
