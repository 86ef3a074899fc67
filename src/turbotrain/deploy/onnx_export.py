"""export(cfg) for the ONNX deploy options: <run>/export/<deploy>/model.onnx + report.json + README.txt.

Nothing is written before the fp32 graph has matched the model on real validation batches of two
sizes (and, for text, two lengths) and the artifact has run in a fresh `python -I` process that
imports only onnxruntime and numpy. The report times, in one run on this machine, the artifact,
ONNX Runtime fp32, TorchScript INT8 (deploy=int8's path) and the fp32 eager model.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

from turbotrain.core.atomic import atomic_write_text
from turbotrain.core.errors import UserError
from turbotrain.core.timing import interleaved_latency_ms
from turbotrain.deploy import onnx as ox
from turbotrain.deploy import report as report_io
from turbotrain.deploy.quantize import BACKEND, DEPLOY, quantize_for
from turbotrain.deploy.script import KeywordInputs, convert, frozen, state_dict_mb
from turbotrain.train.evaluation import evaluate
from turbotrain.train.precision import FP32_CPU

log = logging.getLogger("turbotrain")
CPU = torch.device("cpu")

FRESH = """
import sys
sys.modules["torch"] = None  # an artifact that needs torch (or turbotrain) fails to load here
import numpy as np, onnxruntime as ort
sess = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
np.save(sys.argv[3], sess.run(["logits"], dict(np.load(sys.argv[2])))[0])
"""


def positional(inputs, text: bool) -> tuple:
    return (inputs["input_ids"], inputs["attention_mask"]) if text else (inputs,)


def fresh_process_logits(path: Path, args: tuple, text: bool) -> np.ndarray:
    """The artifact's logits computed in a new interpreter (-I: no user site, no PYTHONPATH)."""
    with tempfile.TemporaryDirectory() as tmp:
        feed, out = Path(tmp) / "in.npz", Path(tmp) / "out.npy"
        np.savez(feed, **{n: a.numpy() for n, a in zip(ox.input_names(text), args, strict=True)})
        done = subprocess.run([sys.executable, "-I", "-c", FRESH, str(path), str(feed), str(out)], capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise UserError(f"deploy: {path.name} does not run in a fresh ONNX Runtime process: {last}")
        return np.load(out)


class SessionLogits:
    """An ONNX Runtime session called as the training loop's evaluate calls a model: images
    positionally, text batches as keywords; logits as a tensor."""

    def __init__(self, sess, text: bool):
        self.sess, self.text = sess, text

    def __call__(self, *images, **text_inputs) -> torch.Tensor:
        args = (text_inputs["input_ids"], text_inputs["attention_mask"]) if self.text else images
        return torch.from_numpy(ox.run(self.sess, args, self.text))


def top1(model, val_loader, limit: int | None) -> dict:
    """evaluate()'s figures (acc1, samples) on the validation split, in fp32 on the CPU."""
    return evaluate(model, val_loader, device=CPU, precision=FP32_CPU, max_batches=limit)


def parity_batches(val_loader, text: bool) -> list[tuple]:
    """Two real validation batches of different sizes (text: and lengths): the dynamic dims."""
    first = positional(next(iter(val_loader))[0], text)
    small = tuple(a[:7] for a in first)
    if text:  # a shorter length too: cut to the longest real sequence of the small batch
        length = max(2, int(small[1].sum(1).max()))
        small = tuple(a[:, :length] for a in small)
    return [first, small]


def latencies(model: nn.Module, sessions: dict, torchscript, example: tuple, text: bool, repeats: int) -> dict:
    """ms per call at batch 1 and 32: the artifact, ONNX Runtime fp32, TorchScript INT8, fp32 eager."""
    figures = {}
    for suffix, args, n in (("", tuple(a[:1] for a in example), repeats), ("_b32", example, 10)):
        fns = {k: (lambda *a, s=s: ox.run(s, a, text)) for k, s in sessions.items()}
        fns.update({"torchscript_int8": torchscript, "fp32": model})
        with torch.no_grad():
            ms = interleaved_latency_ms(fns, args, repeats=n)
        figures.update({f"{'' if k == 'artifact' else k + '_'}latency_ms{suffix}": v for k, v in ms.items()})
    return figures


def torchscript_int8(model: nn.Module, kind: str, calib, inputs, example: tuple, batches: int):
    target, _ = quantize_for("int8", model, kind, calib, inputs, batches)
    return frozen(convert(target, tuple(a[:1] for a in example), "trace"))


def export_onnx(cfg, model: nn.Module, arch: dict, data, loaders: tuple, export_dir: Path) -> dict:
    """Steps of an ONNX export; returns the report's figures (the caller adds where it came from)."""
    val_loader, calib = loaders
    int8 = DEPLOY.of(cfg.deploy).traits.get("int8", False)
    text, threads = arch["kind"] == "text", torch.get_num_threads()
    inputs = next(iter(val_loader))[0]
    example = positional(inputs, text)
    export_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=export_dir.parent) as tmp:
        fp32_path, out = Path(tmp) / "fp32.onnx", Path(tmp) / "model.onnx"
        opset = ox.to_onnx(model, example, fp32_path, text)
        fp32 = ox.session(fp32_path, threads)
        diff = ox.check_parity(fp32, model, parity_batches(val_loader, text), text, arch["model"]["name"])
        if not int8:
            fp32_path.replace(out)
            quant = {}
        elif text:
            quant = ox.quantize_text(fp32_path, out)
        else:
            quant = ox.quantize_image(fp32_path, out, calib, cfg.deploy.calibration_batches, threads, example)
        artifact = ox.session(out, threads)
        here = ox.run(artifact, example, text)
        if not np.allclose(fresh_process_logits(out, example, text), here, atol=1e-5):
            raise UserError(f"deploy: {out.name} gives other logits in a fresh process than here")
        limit = cfg.deploy.val_batches
        acc = top1(SessionLogits(artifact, text), val_loader, limit)
        onnx_fp32 = top1(SessionLogits(fp32, text), val_loader, limit) if int8 else acc  # fp32: the same graph
        eager = top1(KeywordInputs(model) if text else model, val_loader, limit)
        ts = torchscript_int8(model, arch["kind"], calib, inputs, example, cfg.deploy.calibration_batches)
        sessions = {"artifact": artifact, "onnx_fp32": fp32} if int8 else {"artifact": artifact}
        timed = latencies(model, sessions, ts, example, text, cfg.deploy.latency_repeats)
        figures = {
            "format": "onnx",
            "opset": opset,
            "onnxruntime": __import__("onnxruntime").__version__,
            "dtype": "int8 (" + ("dynamic" if text else "static QDQ, per-channel weights") + ")" if int8 else "float32",
            **quant,
            "quantized_ops": ox.quantized_ops(out),
            "size_mb": out.stat().st_size / 2**20,
            "fp32_size_mb": state_dict_mb(model),
            "onnx_fp32_size_mb": (out if not int8 else fp32_path).stat().st_size / 2**20,
            "val_acc1": acc["acc1"],
            "onnx_fp32_val_acc1": onnx_fp32["acc1"],
            "fp32_val_acc1": eager["acc1"],
            "val_samples": acc["samples"],
            "fp32_max_abs_diff": diff,
            "parity_tolerance": ox.PARITY_ATOL,
            "threads": threads,
            "quantized_engine_torchscript": BACKEND,
            **timed,
        }
        export_dir.mkdir(parents=True, exist_ok=True)
        out.replace(export_dir / "model.onnx")
    return figures


def write_readme(export_dir: Path, report: dict) -> None:
    spec = report["input"]
    if spec.get("tokenizer"):
        call = (
            "from transformers import AutoTokenizer   # or any tokenizer that reads tokenizer/\n"
            f'tokens = AutoTokenizer.from_pretrained("{spec["tokenizer"]}")(texts, padding=True, truncation=True,\n'
            f'                                         max_length={spec["max_length"]}, return_tensors="np")\n'
            'logits = sess.run(["logits"], {"input_ids": tokens["input_ids"].astype("int64"),\n'
            '                               "attention_mask": tokens["attention_mask"].astype("int64")})[0]'
        )
    else:
        call = 'logits = sess.run(["logits"], {"images": images})[0]   # images: float32 [N, C, H, W]'
    atomic_write_text(
        export_dir / "README.txt",
        f"""turbotrain export: {report["deploy"]} (ONNX opset {report["opset"]}, {report["dtype"]})
Run: {report["run"]}

Load it with ONNX Runtime alone (onnxruntime {report["onnxruntime"]}, numpy):

import onnxruntime as ort
sess = ort.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
{call}

{"Batch size and sequence length are" if spec.get("tokenizer") else "Batch size is"} free. Input: {spec["preprocessing"]}.
{report_io.readme_tail(report)}""",
    )
