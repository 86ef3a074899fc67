"""Run-time choices that change a run's numbers, and what a resume keeps of them.

Three are config keys whose auto value (`auto` or null) the run resolves at start: SGD's CPU
kernel (`optim.kernel`: fused and foreach round a vector's tail differently on AVX2 and AVX-512),
amp's CPU path (`precision.cpu_bf16`) and the intra-op thread count (`trainer.threads`: how
reductions are split). The resolved values go into the run's effective config, which every
checkpoint saves; a resume whose command leaves a key at auto takes the saved value, whatever this
process would pick (autotune's picks are kept the same way, by autotune.choice_from_checkpoint).
What no process can choose, the CPU's vector path, the device and the torch build, is the
checkpoint's `platform` record: a resume on another platform says in one line that it is not
bit-exact. `trainer.deterministic` picks CUDA's kernels for repeatability over speed.

On a GPU a resume is bit-exact only with trainer.deterministic: cuDNN's benchmark mode picks
kernels by timing them, and some kernels add with atomics in whatever order threads finish."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable

import torch
from omegaconf import OmegaConf
from torch import nn

from turbotrain.config import registries
from turbotrain.core.cpu import cpu_flags
from turbotrain.train.optim import auto_kernel, param_groups
from turbotrain.train.precision import native_bf16_cpu

log = logging.getLogger("turbotrain")

AUTO = {"optim.kernel": "auto", "precision.cpu_bf16": None, "trainer.threads": None}
PROCESS_THREADS = torch.get_num_threads()  # torch's choice for this process, before any job set its own
# the instruction sets that pick oneDNN's, MKL's and ATen's kernels, and the variables that cap them
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8", "amx_fp16")
ISA_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def set_threads(threads: int | None) -> None:
    """trainer.threads, or torch's own count for this process (set both ways: a sweep's next job
    starts afresh)."""
    torch.set_num_threads(threads or PROCESS_THREADS)


def set_kernels(deterministic: bool, device: torch.device) -> None:
    """trainer.deterministic: deterministic algorithms (torch warns naming an op that has none)
    and cuDNN's deterministic kernels; else cuDNN times its kernels on a GPU (a run's shapes are
    fixed). Set both ways: a sweep's next job starts afresh."""
    if deterministic:  # cuBLAS reads it when the process makes its first handle: a sweep's later job sets it in vain
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = device.type == "cuda" and not deterministic


def inexact_resume(device: torch.device, deterministic: bool) -> str | None:
    """The line a resume logs when its device's kernels cannot repeat the interrupted run's."""
    if device.type != "cuda" or deterministic:
        return None
    return (
        "resuming on CUDA without trainer.deterministic=true: cuDNN picks kernels by timing them and some "
        "kernels add in any order, so the run continues close to, not bit-equal with, an uninterrupted one"
    )


def _selected(cfg, key: str) -> bool:
    """Whether `key` belongs to the option its group selects (optim.kernel under sgd only)."""
    group, _, field = key.partition(".")
    if group == "trainer":
        return True
    return field in {f.name for f in dataclasses.fields(registries()[group].of(cfg[group]).schema)}


def keep_saved(cfg, ckpt: dict) -> list[str]:
    """Sets each key the command leaves at auto to the value the checkpoint's run resolved;
    returns them as `key=value` (none for a checkpoint from before these were recorded)."""
    saved, kept = OmegaConf.create(ckpt["config"]), []
    for key, auto in AUTO.items():
        value = OmegaConf.select(saved, key, default=auto)
        if _selected(cfg, key) and OmegaConf.select(cfg, key) == auto and value != auto:
            OmegaConf.update(cfg, key, value)
            kept.append(f"{key}={str(value).lower()}")
    return kept


def resolve(cfg, model: nn.Module, device: torch.device, agree: Callable[[list[int]], list[int]], ckpt: dict | None) -> None:
    """Fixes the run's choices in `cfg`: a resume's from its checkpoint, the rest as this process
    picks them, `agree`d across DDP ranks (the largest; a rank on another kernel would drift)."""
    if ckpt is not None:
        if kept := keep_saved(cfg, ckpt):
            log.info("resume: %s, as the run chose (this process's own choice could change the numbers)", ", ".join(kept))
        warn_if_moved(ckpt.get("platform"), platform(device))
        if line := inexact_resume(device, cfg.trainer.deterministic):
            log.warning(line)
    if _selected(cfg, "optim.kernel") and cfg.optim.kernel == "auto":
        # the device the run trains on: the model is not placed yet
        params = [p for g in param_groups(model, cfg.optim) for p in g["params"]]
        fused = auto_kernel(params, cfg.optim, device) == "fused"
        cfg.optim.kernel = "fused" if agree([int(fused)])[0] else "foreach"
    if _selected(cfg, "precision.cpu_bf16") and cfg.precision.cpu_bf16 is None and device.type == "cpu":
        cfg.precision.cpu_bf16 = bool(agree([int(native_bf16_cpu())])[0])
    set_threads(cfg.trainer.threads)
    cfg.trainer.threads = torch.get_num_threads()


def platform(device: torch.device) -> dict:
    """The checkpoint's `platform` record: what decides the kernels besides the config."""
    flags = cpu_flags() or frozenset()
    return {
        "cpu_vendor": next((v for v in ("GenuineIntel", "AuthenticAMD") if v in flags), "other"),  # MKL's paths differ
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_isa": [f for f in ISA_FLAGS if f in flags],
        "isa_caps": {k: os.environ[k] for k in ISA_CAPS if os.environ.get(k)},
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": str(torch.__version__),
    }


def warn_if_moved(saved: dict | None, here: dict) -> None:
    """One line when the resumed run's kernels cannot be the saved run's (None: a checkpoint from
    before the record, about which nothing is known)."""
    if saved is None:
        return
    moved = [f"{k} {saved.get(k)} -> {v}" for k, v in here.items() if saved.get(k) != v]
    if moved:
        log.warning(
            "resuming on another platform (%s): its kernels round differently, so the run continues close to, "
            "not bit-equal with, an uninterrupted one (ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA can select "
            "a lower CPU path)",
            "; ".join(moved),
        )
