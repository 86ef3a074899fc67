"""Mixed precision policy: autocast dtype and GradScaler per device.

amp  -> CUDA: fp16 autocast + GradScaler; CPU: bf16 autocast (AMX/AVX-512 BF16), no scaler.
bf16 -> bf16 autocast anywhere, no scaler (bf16 has fp32's exponent range).
fp16 -> fp16 autocast + GradScaler anywhere.
fp32 -> nothing; `precision.tf32` allows TF32 matmuls/convs on CUDA.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch


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


FP32_CPU = Precision("fp32", "cpu", None, None)  # reference evaluations (export, compression)


def build_precision(precision_cfg, device: torch.device) -> Precision:
    name = precision_cfg.name
    if device.type == "cuda" and precision_cfg.tf32:
        # The fp32_precision API replaces allow_tf32 in torch >= 2.9.
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        torch.backends.cudnn.conv.fp32_precision = "tf32"
    if name == "fp32":
        dtype = None
    elif name == "bf16" or (name == "amp" and device.type != "cuda"):
        dtype = torch.bfloat16
    else:  # fp16, or amp on CUDA
        dtype = torch.float16
    scaler = None
    if dtype is torch.float16:
        scaler = torch.amp.GradScaler(
            device.type,
            init_scale=precision_cfg.init_scale,
            growth_interval=precision_cfg.growth_interval,
        )
    return Precision(name, device.type, dtype, scaler)
