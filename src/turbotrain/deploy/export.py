"""export(cfg): newest run (or cfg.run) -> <run>/export/<deploy>/model.pt + report.json + README.txt."""

from __future__ import annotations

import contextlib
import logging
import warnings
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torch.utils.data import DataLoader

from turbotrain.config.validation import check_group
from turbotrain.core import checkpoint as ckpt_io
from turbotrain.core.atomic import atomic_write
from turbotrain.core.schema import ConfigError
from turbotrain.core.timing import interleaved_latency_ms
from turbotrain.data import build_data
from turbotrain.data.text import PadCollate
from turbotrain.deploy import report as report_io
from turbotrain.deploy.quantize import BACKEND, DEPLOY, quantize_for
from turbotrain.deploy.script import TextLogits, convert, frozen, reload, state_dict_mb
from turbotrain.models import build_tokenizer_for, from_checkpoint

log = logging.getLogger("turbotrain")
NAMED = ("best", "last")


@contextlib.contextmanager
def quiet_deprecations():
    """torch 2.14 marks TorchScript and torch.ao.quantization deprecated on every call;
    say it once instead of flooding the console."""
    log.info(
        "note: TorchScript and torch.ao.quantization are deprecated in torch %s (successor: torch.export"
        " + PT2E/torchao + AOTInductor). turbotrain still uses them because the artifact must load with"
        " torch.jit.load alone; their warnings are silenced here.",
        torch.__version__.split("+")[0],
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        for pattern in ("(?s).*deprecated.*", "(?s).*reduce_range.*", "(?s).*TorchScript type system.*"):
            warnings.filterwarnings("ignore", message=pattern)
        yield


def find_run(run: str | None, outputs_dir: str, checkpoint: str) -> Path:
    if run:
        run_dir = Path(run).expanduser()
        if not run_dir.is_dir():
            raise ConfigError(f"run={run}: no such run dir")
        return run_dir
    if checkpoint not in NAMED:
        raise ConfigError(f"checkpoint={checkpoint}: a checkpoint file needs its run: pass run=<run dir>")
    found = sorted(Path(outputs_dir).glob(f"**/checkpoints/{checkpoint}.pt"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise ConfigError(
            f"no run with checkpoints/{checkpoint}.pt under {outputs_dir}/: train first (python train.py) or pass run=<run dir>"
        )
    return found[-1].parent.parent


def inside(run_dir: Path, path: Path) -> bool:
    """Whether `path`, with every symlink followed, lies in the run dir."""
    return path.resolve().is_relative_to(run_dir.resolve())


def checkpoint_file(run_dir: Path, checkpoint: str) -> Path:
    """`best`, `last`, or a file inside the run dir (relative to it, or absolute)."""
    if checkpoint in NAMED:
        path = run_dir / "checkpoints" / f"{checkpoint}.pt"
        if not path.is_file():
            raise ConfigError(f"run={run_dir}: no checkpoints/{checkpoint}.pt in it (did training finish an epoch?)")
        return path
    path = run_dir / Path(checkpoint).expanduser()  # an absolute path replaces run_dir
    if not inside(run_dir, path):
        raise ConfigError(f"checkpoint={checkpoint}: must be best, last or a file inside the run dir {run_dir}")
    if not path.is_file():
        raise ConfigError(f"checkpoint={checkpoint}: no such file in {run_dir}")
    return path


def export_dir_of(run_dir: Path, name: str) -> Path:
    """<run>/export/<name>, refused when a symlink on the way leads out of the run dir."""
    export_dir = run_dir / "export" / name
    if not inside(run_dir, export_dir):
        raise ConfigError(
            f"{export_dir} leads outside the run dir (a symlink to {export_dir.resolve()}); export writes only "
            "inside the run: remove the link"
        )
    return export_dir


def _loader(dataset, batch_size: int, shuffle: bool, collate=None) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, generator=g, collate_fn=collate)


def _candidates(kind: str) -> list[tuple[str, bool]]:
    """(method, freeze) pairs to time; transformers only trace (their forward is not scriptable)."""
    if kind == "text":
        return [("trace", True), ("trace", False)]
    return [("script", True), ("script", False), ("trace", True)]


def _fastest_torchscript(target, example: tuple, deploy_cfg, kind: str):
    """Convert with each candidate method, time them at batch 1, keep the fastest."""
    candidates = _candidates(kind)
    converted = {}
    for method in dict(candidates):
        try:
            converted[method] = convert(target, example, method)
        except RuntimeError as e:
            # torch 2.14's scripting of plain Conv2d fails intermittently here ("builtin cannot be
            # used as a value: self._reversed_padding_repeated_twice"); the other method still ships.
            first = next(line for line in str(e).splitlines() if line.strip())
            log.warning("TorchScript %s failed, skipping it: %s", method, first.strip()[:200])
    if not converted:
        raise RuntimeError("every TorchScript conversion failed; see the warnings above")
    modules = {
        f"{method}{'+freeze' if freeze else ''}": reload(frozen(converted[method]) if freeze else converted[method])
        for method, freeze in candidates
        if method in converted
    }
    timed = interleaved_latency_ms(modules, example, repeats=deploy_cfg.latency_repeats)
    best = min(timed, key=timed.get)
    log.info("TorchScript candidates at batch 1 (ms): %s -> %s", timed, best)
    return best, timed, modules[best]


def _export_onnx(cfg, model, arch: dict, data, val_loader, tokenizer, export_dir: Path, run_dir: Path, ckpt_path: Path) -> Path:
    from turbotrain.deploy.onnx_export import export_onnx, write_readme  # onnxruntime: the [onnx] extra

    calib = _loader(data.train_eval, 32, shuffle=True, collate=data.collate)
    with quiet_deprecations():  # the TorchScript INT8 it is timed against
        figures = export_onnx(cfg, model, arch, data, (val_loader, calib), export_dir)
    spec = report_io.input_spec(arch)
    if tokenizer is not None:  # the graph takes any length up to the trained one
        report_io.save_tokenizer(tokenizer, export_dir / report_io.TOKENIZER)
        n = arch["max_length"]
        how = f"tokenize with {report_io.TOKENIZER}/, truncation to {n} tokens"
        spec.update(shape=["N", f"L <= {n}"], max_length=n, preprocessing=how)
    report = {
        "deploy": cfg.deploy.name,
        **figures,
        "input": spec,
        "torch": torch.__version__,
        "run": run_dir.resolve().name,
        "checkpoint": str(ckpt_path.resolve().relative_to(run_dir.resolve())),
    }
    report_io.write_json(export_dir, report)
    write_readme(export_dir, report)
    _log_written(report, export_dir)
    return export_dir


def _log_written(report: dict, export_dir: Path) -> None:
    log.info(
        "%s: %.2f MB (fp32 %.2f MB), %.3f ms vs fp32 eager %.3f ms at batch 1, top-1 %.4f (fp32 %.4f) -> %s",
        *(report["deploy"], report["size_mb"], report["fp32_size_mb"], report["latency_ms"], report["fp32_latency_ms"]),
        *(report["val_acc1"], report["fp32_val_acc1"], export_dir),
    )


def export(cfg) -> Path:
    check_group(cfg, "deploy")
    run_dir = find_run(cfg.run, cfg.outputs_dir, cfg.checkpoint)
    ckpt_path = checkpoint_file(run_dir, cfg.checkpoint)
    export_dir = export_dir_of(run_dir, cfg.deploy.name)
    ckpt = ckpt_io.load(ckpt_path)
    arch, train_cfg = ckpt["arch"], OmegaConf.create(ckpt["config"])
    threads = cfg.deploy.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    text = arch["kind"] == "text"
    model = from_checkpoint(ckpt, ckpt_path)
    tokenizer = build_tokenizer_for(OmegaConf.create(arch["model"]), arch.get("max_length", 0))
    if train_cfg.data.get("decode") == "gpu":  # export evaluates on the CPU: decode there
        train_cfg.data.decode = "cpu"
    data = build_data(train_cfg.data, tokenizer)
    onnx = DEPLOY.of(cfg.deploy).traits.get("format") == "onnx"
    if text:  # TorchScript takes fixed-length inputs (tracing bakes the length in); ONNX a free length
        model = TextLogits(model).eval()
        data.collate = PadCollate(tokenizer.pad_token_id or 0, length=None if onnx else arch["max_length"])
    val_loader = _loader(data.val, 32, shuffle=False, collate=data.collate)
    if onnx:
        return _export_onnx(cfg, model, arch, data, val_loader, tokenizer, export_dir, run_dir, ckpt_path)
    inputs = next(iter(val_loader))[0]
    example = (inputs["input_ids"], inputs["attention_mask"]) if text else (inputs,)
    with quiet_deprecations():
        calib = _loader(data.train_eval, 32, shuffle=True, collate=data.collate)
        target, dtype = quantize_for(cfg.deploy.name, model, arch["kind"], calib, inputs, cfg.deploy.calibration_batches)
        best, timed, module = _fastest_torchscript(target, tuple(a[:1] for a in example), cfg.deploy, arch["kind"])
        export_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(export_dir / "model.pt", lambda f: torch.jit.save(module, f))
        if text:
            report_io.save_tokenizer(tokenizer, export_dir / report_io.TOKENIZER)
        fp32_size = state_dict_mb(model)
        checks = report_io.verify(export_dir / "model.pt", model, val_loader, example, cfg.deploy, text=text)
    report = {
        "deploy": cfg.deploy.name,
        "format": "torchscript",
        "method": best,
        "candidates_ms": timed,
        "dtype": dtype,
        "size_mb": (export_dir / "model.pt").stat().st_size / 2**20,
        "fp32_size_mb": fp32_size,
        **checks,
        "threads": threads,
        "input": report_io.input_spec(arch),
        "torch": torch.__version__,
        "quantized_engine": BACKEND,
        "run": run_dir.resolve().name,  # relative: the folder ships without the builder's paths
        "checkpoint": str(ckpt_path.resolve().relative_to(run_dir.resolve())),
    }
    report_io.write(export_dir, report)
    _log_written(report, export_dir)
    return export_dir
