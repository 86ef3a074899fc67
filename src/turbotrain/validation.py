"""validate(cfg): the values whose allowed set is closed or bounded, checked before a run starts,
each failure named in one line (Hydra's schema has already checked keys and types)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from turbotrain.config import ConfigError, TrainConfig

CHOICES = {
    "data.resolution": ("fixed", "dynamic", "progressive"),
    "data.on_bad_sample": ("skip", "error"),
    "trainer.on_nan": ("skip", "stop"),
    "trainer.nan_check": ("loss", "grads"),
    "precision.name": ("fp32", "amp", "bf16", "fp16"),
    "optim.name": ("sgd", "adam", "adamw", "rmsprop", "adagrad"),
    "sched.name": ("none", "cosine", "cyclic", "onecycle", "step"),
    "trainer.accum_bn": ("none", "freeze"),
    "logger.name": ("none", "wandb"),
    "logger.mode": ("offline", "online", "disabled"),
    "attention.name": ("full", "sliding_window"),
    "attention.implementation": ("sdpa", "eager"),
    "compression.name": ("none", "channel_prune", "weight_prune", "embed_lowrank"),
    "compression.targets": ("embedding", "linear", "both"),
    "compression.importance": ("l1", "group_l1", "taylor"),
    "distributed.name": ("none", "ddp"),
    "distributed.backend": ("auto", "nccl", "gloo"),
    "profiler.name": ("none", "torch"),
}

POSITIVE = (
    "data.batch_size",
    "data.resolution_step",
    "optim.lr",
    "trainer.grad_accum_steps",
    "trainer.max_epochs",
    "trainer.log_every_n_steps",
    "distributed.nproc",
    "compression.steps",
    "distributed.timeout_s",
    "trainer.autotune_steps",
)

AUTOTUNE_KNOBS = ("channels_last", "compile", "num_workers", "attention")  # settings that leave the numerics alone


OPEN_UNIT = (  # must lie strictly between 0 and 1 when set
    "compression.flops_reduction",
    "compression.channel_ratio",
    "compression.sparsity",
    "compression.energy",
    "data.val_fraction",
)


def _get(cfg: Any, dotted: str) -> Any:
    node = cfg
    for part in dotted.split("."):
        node = node[part]
    return node


def _check_known_keys(cfg: Any, schema: type) -> None:
    # Hydra's `+key=value` appends even to structured configs: catch misspelt ones here.
    for f in fields(schema):
        section = cfg.get(f.name)
        if section is None or not hasattr(section, "keys"):
            continue
        known = {g.name for g in fields(f.default_factory)}
        unknown = sorted(set(section.keys()) - known)
        if unknown:
            raise ConfigError(f"unknown key {f.name}.{unknown[0]}; known keys: {', '.join(sorted(known))}")


def validate(cfg: Any) -> None:
    """Raise ConfigError naming the first key whose value the pipeline cannot use."""
    _check_known_keys(cfg, TrainConfig)
    for key, allowed in CHOICES.items():
        value = _get(cfg, key)
        if value not in allowed:
            raise ConfigError(f"{key}={value!r} is not supported; allowed: {', '.join(allowed)}")
    for key in POSITIVE:
        value = _get(cfg, key)
        if value is None or value <= 0:
            raise ConfigError(f"{key}={value!r} must be > 0")
    for key in OPEN_UNIT:
        value = _get(cfg, key)
        if value is not None and not 0 < value < 1:
            raise ConfigError(f"{key}={value!r} must be between 0 and 1 (exclusive)")
    for key in ("trainer.max_steps", "trainer.limit_train_batches", "trainer.limit_val_batches"):
        value = _get(cfg, key)
        if value is not None and value <= 0:
            raise ConfigError(f"{key}={value!r} must be > 0 or null")
    _check_resolution(cfg.data)
    unknown = sorted(set(cfg.trainer.autotune_knobs) - set(AUTOTUNE_KNOBS))
    if unknown:
        raise ConfigError(f"trainer.autotune_knobs: unknown knob {unknown[0]!r}; allowed: {', '.join(AUTOTUNE_KNOBS)}")


def _check_resolution(data: Any) -> None:
    lo, hi = data.resolution_scale
    if not 0 < lo <= hi:
        raise ConfigError(f"data.resolution_scale={[lo, hi]} must be 0 < low <= high")
    if not 0 < data.progressive_start <= 1:
        raise ConfigError(f"data.progressive_start={data.progressive_start} must be in (0, 1] (a fraction of data.image_size)")
    begin, end = data.progressive_from, data.progressive_until
    if not 0 <= begin <= end <= 1:
        raise ConfigError(f"data.progressive_from={begin}, progressive_until={end}: need 0 <= from <= until <= 1")
