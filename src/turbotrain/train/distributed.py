"""DDP through torch.distributed: set-up/teardown, rank facts, launching, reductions.

Two ways in, one code path:
- `torchrun [--nnodes ...] train.py distributed=ddp`: torchrun's env (RANK, WORLD_SIZE,
  LOCAL_RANK, MASTER_ADDR/PORT) is detected and used.
- `python train.py distributed=ddp distributed.nproc=N`: this process launches N workers through
  torch's elastic launcher (torchrun's engine) and waits; see `launch`.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import signal
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from turbotrain.core.errors import UserError
from turbotrain.core.registry import Registry
from turbotrain.core.schema import NON_NEGATIVE, POSITIVE, ConfigError, setting
from turbotrain.train.preemption import Preempted, resume_hint
from turbotrain.train.resume import restarts

log = logging.getLogger("turbotrain")
SELF_LAUNCHED = "TURBOTRAIN_DDP_LAUNCHED"


class LaunchError(UserError, RuntimeError):
    """A DDP worker failed or never joined; the message names the rank."""


@dataclass
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    # a gloo group for every collective of CPU tensors: NCCL's default group has no CPU backend, and
    # a per-step agreement over it would wait for the GPU's queue (None without DDP)
    cpu_group: object = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


DISTRIBUTED = Registry("distributed")


@dataclass
class DistributedConfig:
    name: str = "none"  # the option (distributed=<name>)
    nproc: int = setting(1, bound=POSITIVE)  # workers this process launches (ignored under torchrun)


@dataclass
class DDPConfig(DistributedConfig):
    nproc: int = setting(2, bound=POSITIVE)
    backend: str = setting("auto", choices=("auto", "nccl", "gloo"))  # auto: nccl on CUDA, gloo on CPU
    timeout_s: int = setting(1800, bound=POSITIVE)  # a collective waiting longer than this fails the run
    sync_bn: bool = False  # SyncBatchNorm across ranks (CUDA)
    max_restarts: int = setting(0, bound=NON_NEGATIVE)  # restarted workers resume from last.pt


def in_worker_env() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def leads_job() -> bool:
    """The job's leading process: alone, the launcher of turbotrain's own workers, or rank 0 under
    torchrun (a scheduler's requeue is asked for once, by it)."""
    return not in_worker_env() or (not os.environ.get(SELF_LAUNCHED) and int(os.environ["RANK"]) == 0)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"trainer.device={name}: CUDA is not available here; use auto or cpu")
    return device


def launches(dist_cfg) -> bool:
    """Whether this process starts workers (a multi-process option outside torchrun) instead of training."""
    return DISTRIBUTED.of(dist_cfg).traits.get("multi_process", False) and not in_worker_env()


@DISTRIBUTED.register("none", DistributedConfig)
def single_process(dist_cfg, run_dir: Path, overrides: list[str], requeue_signals: tuple = ()) -> None:
    """distributed=none: this process is the only worker; there is nothing to launch."""


def setup(dist_cfg, device_name: str) -> tuple[DistInfo, torch.device]:
    """Join the process group (when launched as a worker) and pick this rank's device."""
    device = pick_device(device_name)
    if not DISTRIBUTED.of(dist_cfg).traits.get("multi_process") or not in_worker_env():
        return DistInfo(), device
    info = DistInfo(int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", 0)), int(os.environ["WORLD_SIZE"]))
    if device.type == "cuda":
        device = torch.device("cuda", info.local_rank)
        torch.cuda.set_device(device)
    backend = dist_cfg.backend if dist_cfg.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
    timeout = datetime.timedelta(seconds=dist_cfg.timeout_s)
    dist.init_process_group(
        backend=backend,
        timeout=timeout,
        device_id=device if device.type == "cuda" else None,
        **_generation_store(info, timeout),
    )
    info.cpu_group = dist.new_group(backend="gloo", timeout=timeout)
    if not info.is_main:
        # One run dir, one writer: only rank 0 appends to Hydra's train.log; the other ranks
        # print warnings and errors only.
        root = logging.getLogger()
        for handler in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
            root.removeHandler(handler)
        log.setLevel(logging.WARNING)
    return info, device


def _generation_store(info: DistInfo, timeout: datetime.timedelta) -> dict:
    """Workers restarted by the elastic agent share its key-value store with the generation they
    replace, and gloo's peer addresses of that dead generation are still in it: a restarted rank
    could read a stale address and fail to connect (seen on torch 2.14, about one restart in two).
    Each generation gets its own key prefix."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    generation = restarts()
    agent = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), info.world_size, is_master=False, timeout=timeout
    )
    store = dist.PrefixStore(f"turbotrain/generation{generation}", agent)
    return {"store": store, "rank": info.rank, "world_size": info.world_size}


def teardown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def rank_zero_first(info: DistInfo) -> Iterator[None]:
    """The block runs on global rank 0, then on the other nodes' local rank 0, then on the rest:
    a download or decoded cache in a folder all nodes share is made once per job, in node-local
    storage once per node. Two barriers in a gloo group whose timeout outlasts an ImageNet-sized
    cache build (distributed.timeout_s is sized for a step)."""
    if not info.enabled:
        yield
        return
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(days=2))
    if info.rank != 0:
        dist.barrier(group=group)  # 1: rank 0 has built
    if info.local_rank != 0:
        dist.barrier(group=group)  # 2: each node's first rank has built (or found rank 0's)
    yield
    if info.rank == 0:
        dist.barrier(group=group)
    if info.local_rank == 0:
        dist.barrier(group=group)
    dist.destroy_process_group(group)


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DDP wrapper (compiled or not), else the model itself."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


@DISTRIBUTED.register("ddp", DDPConfig, multi_process=True)
def launch(dist_cfg, run_dir: Path, overrides: list[str], requeue_signals: tuple = ()) -> None:
    """Start `dist_cfg.nproc` workers running this same train.py with the same overrides and this
    run's dir, through torch.distributed's elastic launcher; raise naming the failed rank. A failed
    worker restarts the whole group up to `distributed.max_restarts` times, continuing from last.pt.
    SIGTERM and the `requeue_signals` reaching this process are passed on to the workers, which
    save and stop (Preempted here)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=dist_cfg.nproc,
        run_id=uuid.uuid4().hex[:12],
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=dist_cfg.max_restarts,
        monitor_interval=0.5,
        rdzv_configs={"timeout": dist_cfg.timeout_s},
        signals_to_handle="SIGINT,SIGHUP,SIGQUIT",  # torch's list without SIGTERM: _stop_once has it
    )
    args = [os.path.abspath(sys.argv[0]), *overrides, f"hydra.run.dir={run_dir}"]
    env = {SELF_LAUNCHED: "1"}  # their run dir is already agreed
    # as torchrun does: N workers x all-cores thread pools oversubscribe the CPU (2-4x slower steps)
    env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // dist_cfg.nproc)))
    log.info("launching %d DDP workers (elastic launcher, c10d rendezvous) into %s", dist_cfg.nproc, run_dir)
    try:
        with _stop_once(SignalException, (signal.SIGTERM, *requeue_signals)), _workers_env(env):
            elastic_launch(config, sys.executable)(*args)
    except SignalException as e:  # the agent has passed the signal on; the workers saved last.pt
        raise Preempted(e.sigval, f"stopped by {e.sigval.name}; {resume_hint(run_dir)}") from e
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        stops = (signal.SIGTERM, signal.SIGINT, *requeue_signals)
        if failure.exitcode in [128 + s for s in stops]:  # one worker was told to stop: all saved
            signum = signal.Signals(failure.exitcode - 128)
            raise Preempted(signum, f"rank {rank} was stopped by {signum.name}; {resume_hint(run_dir)}") from e
        killed = failure.exitcode is not None and failure.exitcode < 0
        reason = f"killed by signal {-failure.exitcode}" if killed else f"exit code {failure.exitcode}"
        raise LaunchError(f"DDP worker rank {rank} failed ({reason}); see {run_dir}/train.log") from e


@contextlib.contextmanager
def _workers_env(env: dict[str, str]) -> Iterator[None]:
    """The workers inherit this process's environment, and only they may see `env` (and what the
    elastic launcher sets, TORCHELASTIC_SIGNALS_TO_HANDLE): a caller that launches again, or starts
    torchrun, from this process afterwards is no worker."""
    before = dict(os.environ)
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)


@contextlib.contextmanager
def _stop_once(signal_exception: type, signals: tuple) -> Iterator[None]:
    """The elastic agent raises on every SIGTERM, also on the second of a burst that arrives while
    it waits for its workers to save and exit, and then abandons them. Here the first of `signals`
    raises as the agent's own handler would (the agent forwards it and waits), the rest are
    ignored; the agent keeps its handlers for the other signals (LaunchConfig.signals_to_handle)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stopping = []

    def handler(signum, frame):
        if not stopping:
            stopping.append(signum)
            raise signal_exception(f"Process {os.getpid()} got signal: {signal.Signals(signum)}", sigval=signal.Signals(signum))

    previous = {s: signal.signal(s, handler) for s in signals}
    try:
        yield
    finally:  # once stopping, the rest of a burst must not cut short the exit (code 128 + signal)
        for s, h in previous.items():
            signal.signal(s, signal.SIG_IGN if stopping else h)
