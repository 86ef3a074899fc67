"""INT8 quantization with torch.ao.quantization (x86 backend).

Static post-training quantization goes through FX graph mode: `prepare_fx` fuses
conv+bn(+relu) and places observers (per-channel weights, histogram activations),
calibration runs real training images with eval transforms, `convert_fx` emits
INT8 kernels. Dynamic INT8 quantizes Linear weights and quantizes activations on
the fly: the path for transformers, whose activations vary too much per input for
fixed scales.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn
from torch.ao.quantization import (
    default_dynamic_qconfig,
    float_qparams_weight_only_qconfig,
    get_default_qconfig_mapping,
    quantize_dynamic,
)
from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

from turbotrain.core.registry import Registry
from turbotrain.core.schema import NON_NEGATIVE, POSITIVE, ConfigError, setting

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
        raise ConfigError(f"deploy.calibration_batches={batches}: static INT8 needs at least one calibration batch")
    return convert_fx(prepared)


def quantize_linear_dynamic(model: nn.Module, embeddings: tuple[str, ...] = ()) -> nn.Module:
    """Dynamic INT8 of every Linear layer, and weight-only INT8 (one scale per row) of the
    Embedding modules named in `embeddings`: in a small transformer the word-embedding table is
    most of the bytes (MiniLM: 47 of 87 MB), and a lookup needs no activation quantization.
    (BERT's token-type lookup takes expanded, non-contiguous indices, which the quantized
    embedding kernel refuses: name the word embeddings only.)"""
    torch.backends.quantized.engine = BACKEND
    qconfig: dict = {nn.Linear: default_dynamic_qconfig}  # qint8 weights (the qconfigs say; a dtype argument is unused)
    qconfig.update({name: float_qparams_weight_only_qconfig for name in embeddings})
    return quantize_dynamic(model.eval(), qconfig)


def word_embedding_names(model: nn.Module, hf_model: nn.Module) -> tuple[str, ...]:
    """Names (in `model`) of the nn.Embedding tables behind hf_model's input embeddings (one, or
    the first half of a low-rank factorization)."""
    emb = hf_model.get_input_embeddings()
    tables = {id(m) for m in emb.modules() if isinstance(m, nn.Embedding)}
    return tuple(name for name, m in model.named_modules() if id(m) in tables)


DEPLOY = Registry("deploy")


@dataclass
class DeployConfig:
    name: str = "int8"  # the option (deploy=<name>)
    calibration_batches: int = setting(0, bound=NON_NEGATIVE)  # batches of training images for static INT8
    val_batches: int | None = setting(None, bound=POSITIVE)  # None: the whole validation split
    latency_repeats: int = setting(30, bound=POSITIVE)  # timed calls per latency figure in report.json
    threads: int | None = setting(None, bound=POSITIVE)  # None: torch's default


@dataclass
class StaticInt8Config(DeployConfig):
    calibration_batches: int = setting(32, bound=NON_NEGATIVE)


def quantize_for(name: str, model: nn.Module, kind: str, calib, example, batches: int) -> tuple[nn.Module, str]:
    """(model to convert, dtype description) for deploy option `name`; `model` itself is left alone."""
    return DEPLOY[name].build(model, kind, calib, example, batches)


@DEPLOY.register("fp32", DeployConfig)
def fp32(model: nn.Module, kind: str, calib, example, batches: int) -> tuple[nn.Module, str]:
    return model, "float32"


@DEPLOY.register("int8", StaticInt8Config)
def int8(model: nn.Module, kind: str, calib, example, batches: int) -> tuple[nn.Module, str]:
    """Static INT8 for CNNs; transformers get dynamic INT8 Linear layers and weight-only INT8
    word embeddings (most of their bytes)."""
    target = copy.deepcopy(model)
    if kind == "image":
        return quantize_static(target, calib, batches, example), "int8 (static, per-channel weights)"
    target = quantize_linear_dynamic(target, word_embedding_names(target, target.model))
    return target, "int8 (dynamic Linear layers, weight-only Embeddings)"


@DEPLOY.register("onnx", StaticInt8Config, format="onnx")  # calibrates the TorchScript INT8 it is timed against
def onnx_fp32(model: nn.Module, kind: str, calib, example, batches: int) -> tuple[nn.Module, str]:
    """ONNX Runtime, float32: the graph from torch.onnx's dynamo exporter (deploy/onnx.py)."""
    return model, "float32"


@DEPLOY.register("onnx_int8", StaticInt8Config, format="onnx", int8=True)
def onnx_int8(model: nn.Module, kind: str, calib, example, batches: int) -> tuple[nn.Module, str]:
    """ONNX Runtime INT8: quantized by onnxruntime on the exported graph (deploy/onnx.py)."""
    return model, "int8"


@DEPLOY.register("int8_dynamic", DeployConfig)
def int8_dynamic(model: nn.Module, kind: str, calib, example, batches: int) -> tuple[nn.Module, str]:
    return quantize_linear_dynamic(copy.deepcopy(model)), "int8 (dynamic, Linear layers)"
