"""Mixed precision policy: autocast dtype and GradScaler per device.

amp  -> CUDA: fp16 autocast + GradScaler; CPU: bf16 autocast where the CPU computes bf16 natively
        (AVX512_BF16/AMX, Arm BF16), else fp32: emulated bf16 trained small_cnn ~9x slower than
        fp32 on an AVX2-only AMD EPYC. TURBOTRAIN_CPU_BF16=1/0 overrides the CPU check, and
        `precision.cpu_bf16` (the run's record of the path taken, kept by a resume) overrides both.
bf16 -> bf16 autocast anywhere, no scaler (bf16 has fp32's exponent range).
fp16 -> fp16 autocast + GradScaler anywhere.
fp32 -> nothing; `precision.tf32` allows TF32 matmuls/convs on CUDA.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass

import torch

from turbotrain.core.cpu import cpu_flags
from turbotrain.core.registry import Registry
from turbotrain.core.schema import POSITIVE, ConfigError, setting


@dataclass
class Precision:
    name: str
    device_type: str
    dtype: torch.dtype | None  # autocast dtype; None = full fp32
    scaler: torch.amp.GradScaler | None

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)


log = logging.getLogger("turbotrain")


CPU_BF16_ENV = "TURBOTRAIN_CPU_BF16"  # 1 or 0: take amp's other CPU path (tests of both paths on any CPU)


def native_bf16_cpu() -> bool:
    """Whether this CPU has bf16 arithmetic units (Linux flags; assumed elsewhere), unless
    TURBOTRAIN_CPU_BF16 says otherwise."""
    forced = os.environ.get(CPU_BF16_ENV, "")
    if forced not in ("", "0", "1"):
        raise ConfigError(f"{CPU_BF16_ENV}={forced!r} must be 1 (bf16), 0 (fp32) or unset (what the CPU has)")
    return forced == "1" if forced else _cpu_flags_have_bf16()


def _cpu_flags_have_bf16() -> bool:
    flags = cpu_flags()
    return flags is None or bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})  # unknown: assumed


FP32_CPU = Precision("fp32", "cpu", None, None)  # reference evaluations (export, compression)
PRECISIONS = Registry("precision")


@dataclass
class PrecisionConfig:
    name: str = "fp32"  # the option (precision=<name>)
    tf32: bool = False  # CUDA: TF32 matmuls and convolutions for the fp32 parts


@dataclass
class Bf16Config(PrecisionConfig):
    tf32: bool = True


@dataclass
class ScaledConfig(PrecisionConfig):
    init_scale: float = setting(65536.0, bound=POSITIVE)  # GradScaler (fp16 autocast)
    growth_interval: int = setting(2000, bound=POSITIVE)  # GradScaler: steps without an overflow before the scale grows


@dataclass
class AmpConfig(ScaledConfig):
    tf32: bool = True
    # CPU: bf16 autocast (true) or fp32 (false); null: what native_bf16_cpu says, resolved at
    # start into the run's effective config, so a resume on another CPU keeps the run's path
    cpu_bf16: bool | None = setting(None, numeric=True)


def build_precision(precision_cfg, device: torch.device) -> Precision:
    # Set both ways (the fp32_precision API replaces allow_tf32 in torch >= 2.9): in a sequential
    # sweep a precision=fp32 job must not inherit the TF32 of an amp job before it. CUDA kernels
    # only read these, so they are set on any device.
    mode = "tf32" if precision_cfg.tf32 else "ieee"
    torch.backends.cuda.matmul.fp32_precision = mode
    torch.backends.cudnn.conv.fp32_precision = mode
    dtype = PRECISIONS.of(precision_cfg).build(precision_cfg, device)
    scaler = None
    if dtype is torch.float16:
        scaler = torch.amp.GradScaler(
            device.type,
            init_scale=precision_cfg.init_scale,
            growth_interval=precision_cfg.growth_interval,
        )
    return Precision(precision_cfg.name, device.type, dtype, scaler)


@PRECISIONS.register("fp32", PrecisionConfig)
def fp32(c, device: torch.device) -> None:
    return None


@PRECISIONS.register("amp", AmpConfig)
def amp(c, device: torch.device) -> torch.dtype | None:
    if device.type == "cuda":
        return torch.float16
    if not (native_bf16_cpu() if c.cpu_bf16 is None else c.cpu_bf16):
        log.info("precision=amp: this CPU has no native bf16 (AVX512_BF16/AMX), so fp32 it is; precision=bf16 forces bf16")
        return None
    return torch.bfloat16


@PRECISIONS.register("bf16", Bf16Config)
def bf16(c, device: torch.device) -> torch.dtype:
    return torch.bfloat16


@PRECISIONS.register("fp16", ScaledConfig)
def fp16(c, device: torch.device) -> torch.dtype:
    return torch.float16
