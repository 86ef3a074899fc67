"""Step 3 of a run: the model's starting weights and its surgery (compression), on the CPU model
before it moves to its device and before the optimizer exists."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torch import nn

from turbotrain import checkpoint as ckpt_io
from turbotrain import preemption
from turbotrain.compression import apply_compression, prune
from turbotrain.config import ConfigError
from turbotrain.loop import TrainState, evaluate, forward, train_one_epoch
from turbotrain.models import load_weights
from turbotrain.optim import build_optimizer
from turbotrain.precision import FP32_CPU
from turbotrain.tracking import Tracker

log = logging.getLogger("turbotrain")


def initial_weights(model: nn.Module, cfg, resume_ckpt: dict | None, resume_path: Path | None) -> None:
    if resume_ckpt is not None:
        load_weights(model, resume_ckpt, resume_path)
    elif cfg.compression.from_run:
        path = Path(cfg.compression.from_run).expanduser() / "checkpoints" / "best.pt"
        load_weights(model, ckpt_io.load(path), path)
        log.info("compression.from_run: starting from %s", path)
    elif cfg.compression.name in ("channel_prune", "weight_prune") and not cfg.model.pretrained:
        log.warning(
            "compression=%s ranks the weights of a model that was never trained (random weights say nothing about "
            "which channels matter): train first and set compression.from_run=<run dir>, or use model.pretrained=true",
            cfg.compression.name,
        )


def apply_surgery(cfg, model: nn.Module, kind: str, train_loader, val_loader, resumed: bool) -> dict | None:
    """Step 3 on the CPU model: attention choices (text), then compression, measured before/after.
    Compression is skipped when resuming (the checkpoint already has the compressed shapes;
    weight-pruning masks are re-applied)."""
    if kind == "text":
        from turbotrain.attention import apply_attention  # transformers: text runs only

        changed = apply_attention(model, cfg.attention)
        log.info("attention: %s", changed)
        if cfg.compression.name == "channel_prune":
            raise ConfigError("compression=channel_prune is for CNNs; text models take embed_lowrank or weight_prune")
    elif cfg.attention.name != "full" or cfg.attention.checkpointing:
        raise ConfigError(f"attention={cfg.attention.name} / attention.checkpointing apply to transformer models only")
    elif cfg.compression.name == "embed_lowrank":
        raise ConfigError("compression=embed_lowrank is for transformer models; CNNs take channel_prune or weight_prune")
    if resumed:
        if cfg.compression.name == "weight_prune":
            prune.weight_prune(model, cfg.compression.sparsity)
        return None
    cpu, fp32 = torch.device("cpu"), FP32_CPU

    def acc(m: nn.Module) -> float:
        return evaluate(m, val_loader, device=cpu, precision=fp32, max_batches=cfg.trainer.limit_val_batches)["acc1"]

    def grad_batch(m: nn.Module) -> None:
        x, y, *_ = next(iter(train_loader))
        m.zero_grad()
        nn.functional.cross_entropy(forward(m, x), y).backward()

    def finetune(m: nn.Module) -> None:
        steps = cfg.compression.finetune_steps
        if steps:
            opt = build_optimizer(m, cfg.optim)
            tracker = Tracker(".", enabled=False, logger_cfg=cfg.logger, config={})
            tc = OmegaConf.merge(cfg.trainer, {"channels_last": False, "max_steps": None})
            train_one_epoch(
                m,
                train_loader,
                opt,
                None,
                fp32,
                TrainState(),
                trainer_cfg=tc,
                device=cpu,
                tracker=tracker,
                batches_in_epoch=min(len(train_loader), steps * tc.grad_accum_steps),
                on_step=lambda _: preemption.stop_now("pruning fine-tuning"),
            )

    example = next(iter(val_loader))[0]
    return apply_compression(model, cfg.compression, example=example, evaluate=acc, finetune=finetune, grad_batch=grad_batch)
