"""deploy=onnx and deploy=onnx_int8: a model.onnx for ONNX Runtime, from torch.onnx's dynamo exporter.

The graph is exported from an example batch of two (a batch of one would specialise the batch
dimension) with the batch, and for text the sequence, as dynamic dimensions. INT8 is ONNX
Runtime's own quantization of that graph: CNNs static, in QDQ format, per-channel weights,
calibrated on training images after `quant_pre_process`; transformers dynamic (weights of the
MatMul/Gemm layers in INT8, activations quantized per call, as their ranges vary per input; the
embedding tables, most of a small BERT's weights, stored in 8 bits with one scale per table).
The activation type of static INT8 is timed per CPU (u8 or s8: which kernel is faster depends
on the CPU) and the faster kept; on CPUs without VNNI the weights use 7 bits (`reduce_range`),
because the u8 x s8 multiply-add without VNNI sums pairs into 16 bits and can saturate.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from torch import nn

from turbotrain.core.cpu import cpu_flags
from turbotrain.core.errors import UserError
from turbotrain.core.timing import interleaved_latency_ms

log = logging.getLogger("turbotrain")
PARITY_ATOL = 1e-3  # fp32 artifact vs eager, on logits: ORT fuses and reorders float sums
VNNI = ("avx512_vnni", "avx_vnni", "amx_int8")


class ParityError(UserError):
    """The fp32 artifact computes something else than the model: nothing is written."""


def input_names(text: bool) -> list[str]:
    return ["input_ids", "attention_mask"] if text else ["images"]


def to_onnx(model: nn.Module, example: tuple, path: Path, text: bool) -> int:
    """Export `model` (eval) to `path`; returns the opset. `example`: a batch of at least two."""
    batch = torch.export.Dim("batch", min=1, max=4096)
    if text:
        seq = torch.export.Dim("sequence", min=2, max=example[0].shape[1])
        dynamic = ({0: batch, 1: seq}, {0: batch, 1: seq})
    else:
        dynamic = ({0: batch},)
    with torch.no_grad():
        program = torch.onnx.export(
            model.eval(),
            example,
            dynamo=True,
            dynamic_shapes=dynamic,
            input_names=input_names(text),
            output_names=["logits"],
            external_data=False,
        )
    program.save(str(path))
    import onnx

    return next(o.version for o in onnx.load(str(path)).opset_import if o.domain in ("", "ai.onnx"))


def session(path: Path, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    # Timed next to torch in one process: ONNX Runtime's pool spins after each call by default and
    # holds the cores torch's next call needs (measured on 2 cores: the eager small_cnn between ORT
    # calls 3-5x slower than alone). Off, ORT's own calls cost a little more: the figures favour torch.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run(sess, args: tuple, text: bool) -> np.ndarray:
    feed = {name: a.numpy() for name, a in zip(input_names(text), args, strict=True)}
    return sess.run(["logits"], feed)[0]


def check_parity(sess, model: nn.Module, batches: list[tuple], text: bool, name: str) -> float:
    """The largest |artifact - eager| over `batches` (real validation batches of different
    sizes); a ParityError naming the model when it exceeds PARITY_ATOL."""
    worst = 0.0
    with torch.no_grad():
        for args in batches:
            worst = max(worst, float(np.abs(run(sess, args, text) - model(*args).numpy()).max()))
    if not worst <= PARITY_ATOL:  # NaN fails too
        raise ParityError(
            f"deploy: the ONNX export of {name} differs from the model by {worst:.3g} on validation batches "
            f"(tolerance {PARITY_ATOL}); nothing was written. The exporter mistranslated an operator: "
            "try deploy=int8 (TorchScript)"
        )
    return worst


class _Calibration:
    """onnxruntime's CalibrationDataReader protocol over `batches` training batches."""

    def __init__(self, loader, batches: int, name: str):
        self.items = iter([{name: inputs.numpy()} for _, (inputs, *_rest) in zip(range(batches), loader, strict=False)])

    def get_next(self):
        return next(self.items, None)

    def rewind(self) -> None:  # a second pass of a calibration method that asks for one
        raise UserError("deploy: the calibration method asked for a second pass; use MinMax calibration")


def has_vnni() -> bool:
    return any(f in (cpu_flags() or ()) for f in VNNI)


def quantize_image(fp32: Path, out: Path, calib, batches: int, threads: int, example: tuple) -> dict:
    """Static QDQ INT8 with each activation type; keeps the faster at batch 1 in `out`. Its
    scratch files go beside `out` (the export's temporary dir)."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    work = out.parent
    pre = work / "pre.onnx"
    quant_pre_process(str(fp32), str(pre))
    reduce_range = not has_vnni()
    candidates = {}
    for label, activation in (("u8s8", QuantType.QUInt8), ("s8s8", QuantType.QInt8)):
        path = work / f"{label}.onnx"
        quantize_static(
            str(pre),
            str(path),
            _Calibration(calib, batches, "images"),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=activation,
            weight_type=QuantType.QInt8,
            reduce_range=reduce_range,
        )
        candidates[label] = path
    sessions = {label: session(p, threads) for label, p in candidates.items()}
    first = tuple(a[:1] for a in example)
    timed = interleaved_latency_ms({k: (lambda *a, s=s: run(s, a, False)) for k, s in sessions.items()}, first, repeats=10)
    best = min(timed, key=timed.get)
    candidates[best].replace(out)
    return {"activation_weight_types": best, "candidates_ms": timed, "reduce_range": reduce_range}


def quantize_text(fp32: Path, out: Path) -> dict:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # The exporter's recorded intermediate shapes trip onnxruntime's shape inference on BERT-family
    # graphs ("Inferred shape and existing shape differ in dimension 0: (64) vs (6)", measured with
    # onnx 1.23 / onnxruntime 1.31): drop them, and the quantizer infers its own
    graph = onnx.load(str(fp32))
    del graph.graph.value_info[:]
    bare = out.with_name("bare.onnx")  # beside `out`, in the export's temporary dir
    onnx.save(graph, str(bare))
    quantize_dynamic(str(bare), str(out), weight_type=QuantType.QInt8)
    return {"activation_weight_types": "dynamic u8 activations, s8 weights, u8 embedding tables", "reduce_range": False}


def quantized_ops(path: Path) -> dict[str, int]:
    """How many quantization nodes the graph holds (QDQ pairs, integer MatMuls)."""
    import onnx

    counts: dict[str, int] = {}
    for node in onnx.load(str(path)).graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "QLinearConv"):
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts
