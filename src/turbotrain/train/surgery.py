"""Step 3 of a run: the model's starting weights and its surgery (compression), on the CPU model
before it moves to its device and before the optimizer exists."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from turbotrain.compression import COMPRESSION, apply_compression
from turbotrain.core import checkpoint as ckpt_io
from turbotrain.core.modules import forward
from turbotrain.models import load_weights
from turbotrain.models.attention.options import apply_attention
from turbotrain.models.whitening import fit_whitening
from turbotrain.train.evaluation import evaluate
from turbotrain.train.loop import short_run
from turbotrain.train.precision import FP32_CPU
from turbotrain.train.preemption import StopFlag

log = logging.getLogger("turbotrain")


def initial_weights(model: nn.Module, cfg, data, resume_ckpt: dict | None, resume_path: Path | None) -> None:
    """A resumed run's weights, compression.from_run's, or a fresh model's with its data-fitted
    layers (models/whitening.py) fitted on `data`'s training images."""
    if resume_ckpt is not None:
        load_weights(model, resume_ckpt, resume_path)
        return
    if cfg.compression.from_run:
        path = Path(cfg.compression.from_run).expanduser() / "checkpoints" / "best.pt"
        load_weights(model, ckpt_io.load(path), path, averaged=True)
        log.info("compression.from_run: starting from %s", path)
        return
    fit_whitening(model, data)  # a fresh model: nothing saved replaces it
    if COMPRESSION.of(cfg.compression).traits.get("ranks_weights") and not cfg.model.pretrained:
        log.warning(
            "compression=%s ranks the weights of a model that was never trained (random weights say nothing about "
            "which channels matter): train first and set compression.from_run=<run dir>, or use model.pretrained=true",
            cfg.compression.name,
        )


def apply_surgery(cfg, model: nn.Module, kind: str, train_loader, val_loader, resumed: bool, stop: StopFlag) -> dict | None:
    """Step 3 on the CPU model: attention choices (text), then compression, measured before/after.
    Compression is skipped when resuming (the checkpoint already has the compressed shapes;
    methods that keep masks re-apply them)."""
    changed = apply_attention(model, cfg.attention, kind)
    if changed:
        log.info("attention: %s", changed)
    option = COMPRESSION.check_fits(cfg.compression, kind)
    if resumed:
        if option.traits.get("reapply_on_resume"):
            option.build(model, cfg.compression, None)
        return None
    cpu, fp32 = torch.device("cpu"), FP32_CPU

    def acc(m: nn.Module) -> float:
        return evaluate(m, val_loader, device=cpu, precision=fp32, max_batches=cfg.trainer.limit_val_batches, stop=stop)["acc1"]

    def grad_batch(m: nn.Module) -> None:
        x, y, *_ = next(iter(train_loader))
        m.zero_grad()
        nn.functional.cross_entropy(forward(m, x), y).backward()

    def finetune(m: nn.Module) -> None:
        steps = cfg.compression.finetune_steps
        if steps:
            batches = min(len(train_loader), steps * cfg.trainer.grad_accum_steps)
            on_step = lambda _: stop.stop_now("pruning fine-tuning")  # noqa: E731
            short_run(m, train_loader, cfg, device=cpu, precision=fp32, batches=batches, on_step=on_step, channels_last=False)

    example = next(iter(val_loader))[0]
    return apply_compression(model, cfg.compression, example=example, evaluate=acc, finetune=finetune, grad_batch=grad_batch)
