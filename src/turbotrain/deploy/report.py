"""Verification figures of an exported artifact and the files that describe it."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from turbotrain.core.atomic import atomic_write_dir, atomic_write_text
from turbotrain.core.timing import interleaved_latency_ms
from turbotrain.deploy.quantize import BACKEND
from turbotrain.deploy.script import KeywordInputs
from turbotrain.train.evaluation import evaluate
from turbotrain.train.precision import FP32_CPU as FP32

CPU = torch.device("cpu")
TOKENIZER = "tokenizer"  # text exports: the tokenizer's files, in this folder of the export


def logits_agreement(artifact, reference: torch.nn.Module, args: tuple) -> dict:
    with torch.no_grad():
        a, r = artifact(*args), reference(*args)
    return {
        "max_abs_diff": (a - r).abs().max().item(),
        "argmax_agreement": (a.argmax(-1) == r.argmax(-1)).float().mean().item(),
        "batch": len(args[0]),
    }


def verify(path: Path, model: torch.nn.Module, val_loader, example: tuple, deploy_cfg, text: bool = False) -> dict:
    """Accuracy, logit agreement and latency of the artifact as loaded from disk, beside the
    float eager model on the same inputs (`example`: the positional arguments of a batch)."""
    artifact = torch.jit.load(str(path))
    as_loop = KeywordInputs if text else (lambda m: m)  # evaluate() passes text batches as keywords
    limit = deploy_cfg.val_batches
    acc = evaluate(as_loop(artifact), val_loader, device=CPU, precision=FP32, max_batches=limit)
    ref = evaluate(as_loop(model), val_loader, device=CPU, precision=FP32, max_batches=limit)
    figures = {
        "val_acc1": acc["acc1"],
        "fp32_val_acc1": ref["acc1"],
        "val_samples": acc["samples"],
        **logits_agreement(artifact, model, example),
    }
    first = tuple(a[:1] for a in example)
    for suffix, batch, repeats in (("", first, deploy_cfg.latency_repeats), ("_b32", example, 10)):
        # A fresh load per batch size: TorchScript's profiling executor specializes on the
        # shapes it has seen, and a deployed model usually serves one batch size.
        fresh = torch.jit.load(str(path))
        ms = interleaved_latency_ms({"fp32": model, "artifact": fresh}, batch, repeats=repeats)
        figures[f"latency_ms{suffix}"] = ms["artifact"]
        figures[f"fp32_latency_ms{suffix}"] = ms["fp32"]
    return figures


def input_spec(arch: dict) -> dict:
    if arch["kind"] == "text":
        n = arch["max_length"]
        return {
            "shape": ["N", n],
            "dtype": "int64",
            "layout": "(input_ids, attention_mask), both [N, max_length]",
            "preprocessing": f"tokenize with the tokenizer in {TOKENIZER}/, truncation and padding to {n} tokens",
            "tokenizer": TOKENIZER,
            "mean": None,
            "std": None,
            "labels": arch["class_names"],
            "output": f"logits [N, {arch['num_classes']}]",
        }
    c, s = arch["in_channels"], arch["image_size"]
    return {
        "shape": ["N", c, s, s],
        "dtype": "float32",
        "layout": "NCHW",
        "preprocessing": (
            f"uint8 pixels / 255, then (x - mean) / std per channel; resize to {s}x{s} "
            "(center crop for photos) as in training's eval transforms"
        ),
        "mean": arch["mean"],
        "std": arch["std"],
        "labels": arch["class_names"],
        "output": f"logits [N, {arch['num_classes']}]",
    }


def _figures(r: dict) -> str:
    return "\n".join(
        [
            f"Validation top-1: {r['val_acc1']:.4f} (float model: {r['fp32_val_acc1']:.4f}), {r['val_samples']} samples.",
            f"Size: {r['size_mb']:.2f} MB (fp32: {r['fp32_size_mb']:.2f} MB).",
            f"Latency, batch 1: {r['latency_ms']:.3f} ms (fp32 eager: {r['fp32_latency_ms']:.3f} ms), {r['threads']} threads.",
        ]
    )


def save_tokenizer(tokenizer, folder: Path) -> None:
    """The tokenizer beside the model, so the export folder ships alone; replaced whole, so a
    killed export never leaves a mix of two tokenizers."""
    atomic_write_dir(folder, tokenizer.save_pretrained)


def _call(spec: dict) -> str:
    if spec.get("tokenizer") is None:
        return f"    logits = model(images)                          # images: {spec['shape']} {spec['dtype']}"
    n = spec["shape"][1]
    return (
        f"    from transformers import AutoTokenizer             # the tokenizer only\n"
        f'    tokens = AutoTokenizer.from_pretrained("{spec["tokenizer"]}")(texts, padding="max_length",\n'
        f'                                                  truncation=True, max_length={n}, return_tensors="pt")\n'
        f'    logits = model(tokens["input_ids"], tokens["attention_mask"])'
    )


def write_json(export_dir: Path, report: dict) -> None:
    export_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(export_dir / "report.json", json.dumps(report, indent=2) + "\n")


def write(export_dir: Path, report: dict) -> None:
    write_json(export_dir, report)
    spec = report["input"]
    atomic_write_text(
        export_dir / "README.txt",
        f"""turbotrain export: {report["deploy"]} ({report["format"]}, {report["dtype"]})
Run: {report["run"]}

Load it with torch alone (torch {report["torch"]}, quantized engine {BACKEND}):

    import torch
    torch.backends.quantized.engine = "{BACKEND}"   # for INT8 models
    model = torch.jit.load("model.pt")
{_call(spec)}

Input: {spec["layout"]} {spec["dtype"]}, {spec["preprocessing"]}.
{readme_tail(report)}""",
    )


def readme_tail(report: dict) -> str:
    """How every export's README.txt ends (TorchScript's and ONNX's): normalization, output and
    label names, then the verified figures."""
    spec = report["input"]
    return f"""mean = {spec["mean"]}
std  = {spec["std"]}
Output: {spec["output"]}; label names in index order:
{json.dumps(spec["labels"])}

{_figures(report)}
"""
