"""Inference: INT8 vs fp32 and TorchScript vs eager, with the deploy stage's own functions
(FX static INT8 for CNNs, dynamic INT8 for MiniLM, trace + freeze), timed interleaved at batch 1
and 32 on the same threads. Weights: random CNNs calibrated on random images, and the real
pretrained MiniLM; sizes and speed do not depend on training (accuracy after INT8 is in the
export reports of real runs, see the README table above)."""

from __future__ import annotations

import copy
import io
import warnings

import torch
from torch import nn

from bench.common import labelled, write
from turbotrain.core.timing import interleaved_latency_ms
from turbotrain.deploy.quantize import quantize_linear_dynamic, quantize_static, word_embedding_names
from turbotrain.deploy.script import TextLogits, frozen, reload


def _scripted(model: nn.Module, example: tuple) -> torch.jit.ScriptModule:
    with torch.no_grad():
        return reload(frozen(torch.jit.trace(model.eval(), example)))


def _mb(module) -> float:
    buf = io.BytesIO()
    torch.jit.save(module, buf) if isinstance(module, torch.jit.ScriptModule) else torch.save(module.state_dict(), buf)
    return buf.tell() / 2**20


def _compare(model: nn.Module, int8: nn.Module, example_at, repeats: int) -> dict:
    """fp32 eager vs fp32 TorchScript vs INT8 TorchScript at batch 1 and 32 (traced per batch
    size: tracing fixes the shapes), and their sizes. `example_at(batch)` gives the inputs."""
    out = {}
    for batch in (1, 32):
        example = example_at(batch)
        fns = {"fp32 eager": model, "fp32 torchscript": _scripted(model, example), "int8 torchscript": _scripted(int8, example)}
        out[f"b{batch}_ms"] = interleaved_latency_ms(fns, example, repeats=repeats)
        out["mb"] = {"fp32": _mb(model), "fp32 torchscript": _mb(fns["fp32 torchscript"]), "int8": _mb(fns["int8 torchscript"])}
    return out


def _cnn(name: str, size: int, repeats: int) -> dict:
    import torchvision

    from turbotrain.models.vision import SmallCNN

    model = SmallCNN(10, in_channels=1, width=32) if name == "small_cnn" else torchvision.models.get_model(name, num_classes=10)
    channels = 1 if name == "small_cnn" else 3
    model.eval()
    calib = [(torch.randn(32, channels, size, size),) for _ in range(8)]
    int8 = quantize_static(copy.deepcopy(model), calib, batches=len(calib), example=torch.randn(1, channels, size, size))
    return _compare(model, int8, lambda batch: (torch.randn(batch, channels, size, size),), repeats)


def _minilm(tokens: int, repeats: int) -> dict:
    from omegaconf import OmegaConf
    from transformers import AutoModelForSequenceClassification

    import turbotrain.options  # noqa: F401  (fills the option registries: model_path looks minilm up)
    from turbotrain.models.text import model_path

    path = model_path(OmegaConf.create({"name": "minilm"}))
    model = TextLogits(AutoModelForSequenceClassification.from_pretrained(path, num_labels=6)).eval()
    int8 = copy.deepcopy(model)
    int8 = quantize_linear_dynamic(int8, word_embedding_names(int8, int8.model))  # as export.py deploy=int8

    def example_at(batch: int) -> tuple:
        ids = torch.randint(1000, 20000, (batch, tokens))
        return ids, torch.ones_like(ids)

    return _compare(model, int8, example_at, repeats)


def _figures(r: dict) -> dict:
    b1, b32, mb = r["b1_ms"], r["b32_ms"], r["mb"]
    return {
        "ours": f"INT8 {mb['fp32'] / mb['int8']:.1f}x smaller ({mb['int8']:.1f} vs {mb['fp32']:.1f} MB); "
        f"batch 1: INT8 {b1['fp32 eager'] / b1['int8 torchscript']:.1f}x, fp32 TorchScript "
        f"{b1['fp32 eager'] / b1['fp32 torchscript']:.2f}x faster than eager "
        f"({b1['int8 torchscript']:.2f} / {b1['fp32 torchscript']:.2f} / {b1['fp32 eager']:.2f} ms); "
        f"batch 32: INT8 {b32['fp32 eager'] / b32['int8 torchscript']:.1f}x, TorchScript "
        f"{b32['fp32 eager'] / b32['fp32 torchscript']:.2f}x",
        "ratio": b1["fp32 eager"] / b1["int8 torchscript"],
    }


LABELS = {  # results key -> row label
    "resnet18@64": "inference resnet18 @64px: INT8 TorchScript vs fp32 eager / TorchScript",
    "small_cnn@28": "inference small_cnn @28px (the default model)",
    "minilm@64 tokens": "inference MiniLM-L6, 64 tokens: INT8 (dynamic Linear, weight-only Embedding) vs fp32",
}


def figures(result: dict) -> list[dict]:
    """Each row's figures, from the raw timings and sizes alone."""
    return [_figures(result["results"][key]) for key in LABELS]


def run(repeats: int = 21) -> str:
    warnings.filterwarnings("ignore")  # torch 2.14 deprecates TorchScript and torch.ao on every call
    results = {
        "resnet18@64": _cnn("resnet18", 64, repeats),
        "small_cnn@28": _cnn("small_cnn", 28, repeats),
        "minilm@64 tokens": _minilm(64, repeats),
    }
    seed = "INT8: 4x smaller, 2.9x faster"
    rows = labelled([(what, seed) for what in LABELS.values()], figures({"results": results}))
    return write("inference", {"results": results, "rows": rows})


if __name__ == "__main__":
    print(run())
