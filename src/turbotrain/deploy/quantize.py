"""INT8 quantization with torch.ao.quantization (x86 backend).

Static post-training quantization goes through FX graph mode: `prepare_fx` fuses
conv+bn(+relu) and places observers (per-channel weights, histogram activations),
calibration runs real training images with eval transforms, `convert_fx` emits
INT8 kernels. Dynamic INT8 quantizes Linear weights and quantizes activations on
the fly: the path for transformers, whose activations vary too much per input for
fixed scales.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.ao.quantization import get_default_qconfig_mapping, quantize_dynamic
from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

BACKEND = "x86"


@torch.no_grad()
def quantize_static(model: nn.Module, calibration, batches: int, example: torch.Tensor) -> nn.Module:
    """FX static INT8 of an eval-mode float model, calibrated on `batches` batches."""
    torch.backends.quantized.engine = BACKEND
    prepared = prepare_fx(model.eval(), get_default_qconfig_mapping(BACKEND), example_inputs=(example,))
    seen = 0
    for inputs, *_ in calibration:
        if seen >= batches:
            break
        prepared(inputs)
        seen += 1
    if seen == 0:
        raise ValueError("deploy.calibration_batches: no calibration batch was run (empty training set?)")
    return convert_fx(prepared)


def quantize_linear_dynamic(model: nn.Module) -> nn.Module:
    torch.backends.quantized.engine = BACKEND
    return quantize_dynamic(model.eval(), {nn.Linear}, dtype=torch.qint8)
