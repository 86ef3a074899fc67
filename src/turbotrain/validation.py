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

# Bounded numeric keys: (low, high, low inclusive, high inclusive); None means unbounded. A key
# whose value is null (where the schema allows it) means "the default" and is not checked.
POSITIVE, NON_NEGATIVE = (0, None, False, False), (0, None, True, False)
UNIT_OPEN, UNIT_HALF_OPEN, UNIT_CLOSED = (0, 1, False, False), (0, 1, True, False), (0, 1, True, True)
BOUNDS = {
    **dict.fromkeys(
        (
            "data.batch_size",
            "data.eval_batch_size",
            "data.image_size",
            "data.max_image_pixels",
            "data.resolution_step",
            "data.num_samples",
            "data.channels",
            "data.max_length",
            "model.width",
            "precision.init_scale",
            "precision.growth_interval",
            "attention.window",
            "attention.block",
            "compression.steps",
            "compression.rank",
            "distributed.nproc",
            "distributed.timeout_s",
            "deploy.val_batches",
            "deploy.latency_repeats",
            "deploy.threads",
            "deploy.autotune_steps",
            "optim.lr",
            "optim.eps",
            "sched.max_lr",
            "sched.cycle_epochs",
            "sched.step_epochs",
            "sched.gamma",
            "loader.prefetch_factor",
            "profiler.active",
            "trainer.max_epochs",
            "trainer.max_steps",
            "trainer.limit_train_batches",
            "trainer.limit_val_batches",
            "trainer.log_every_n_steps",
            "trainer.checkpoint_every_n_steps",
            "trainer.grad_accum_steps",
            "trainer.grad_clip",
            "trainer.threads",
            "trainer.nan_patience",
            "trainer.autotune_steps",
        ),
        POSITIVE,
    ),
    **dict.fromkeys(
        (
            "attention.global_tokens",
            "compression.round_to",
            "deploy.calibration_batches",  # 0: options that do not calibrate
            "compression.finetune_steps",
            "distributed.max_restarts",
            "optim.weight_decay",
            "sched.warmup_steps",
            "loader.num_workers",
            "profiler.wait",
            "profiler.warmup",
            "trainer.seed",
            "trainer.accum_bn_warmup_steps",
        ),
        NON_NEGATIVE,
    ),
    **dict.fromkeys(
        (
            "compression.flops_reduction",
            "compression.channel_ratio",
            "compression.sparsity",
            "compression.energy",
            "data.val_fraction",
            "sched.pct_start",
        ),
        UNIT_OPEN,
    ),
    **dict.fromkeys(("model.dropout", "attention.dropout", "optim.momentum", "optim.alpha"), UNIT_HALF_OPEN),
    **dict.fromkeys(("sched.min_lr_ratio", "sched.base_lr_ratio"), UNIT_CLOSED),
    "data.num_classes": (2, None, True, False),
}
LIST_BOUNDS = {"optim.betas": UNIT_HALF_OPEN, "loader.auto_candidates": NON_NEGATIVE}

AUTOTUNE_KNOBS = ("channels_last", "compile", "num_workers", "attention")  # settings that leave the numerics alone


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
    check_bounds(cfg)
    _check_resolution(cfg.data)
    unknown = sorted(set(cfg.trainer.autotune_knobs) - set(AUTOTUNE_KNOBS))
    if unknown:
        raise ConfigError(f"trainer.autotune_knobs: unknown knob {unknown[0]!r}; allowed: {', '.join(AUTOTUNE_KNOBS)}")


def _describe(bound: tuple) -> str:
    low, high, low_in, high_in = bound
    if high is None:
        return f"must be {'>=' if low_in else '>'} {low}"
    return f"must be in {'[' if low_in else '('}{low}, {high}{']' if high_in else ')'}"


def check_bounds(cfg: Any, sections: tuple[str, ...] | None = None) -> None:
    """The bounded numeric keys (of `sections` only, when given: export checks deploy.*)."""

    def inside(value: float, bound: tuple) -> bool:
        low, high, low_in, high_in = bound
        above = value >= low if low_in else value > low
        below = high is None or (value <= high if high_in else value < high)
        return above and below

    for table, is_list in ((BOUNDS, False), (LIST_BOUNDS, True)):
        for key, bound in table.items():
            if sections is not None and key.split(".")[0] not in sections:
                continue
            value = _get(cfg, key)
            values = list(value) if is_list else [value]
            if value is not None and not all(v is not None and inside(v, bound) for v in values):
                raise ConfigError(f"{key}={value!r} {_describe(bound)}")


def _check_resolution(data: Any) -> None:
    lo, hi = data.resolution_scale
    if not 0 < lo <= hi:
        raise ConfigError(f"data.resolution_scale={[lo, hi]} must be 0 < low <= high")
    if not 0 < data.progressive_start <= 1:
        raise ConfigError(f"data.progressive_start={data.progressive_start} must be in (0, 1] (a fraction of data.image_size)")
    begin, end = data.progressive_from, data.progressive_until
    if not 0 <= begin <= end <= 1:
        raise ConfigError(f"data.progressive_from={begin}, progressive_until={end}: need 0 <= from <= until <= 1")
