"""Augmentation lists from config -> torchvision transforms v2 pipelines.

Each entry is `{name: <torchvision.transforms.v2 class or one of OWN_OPS>, **kwargs}`; the
`random_choice` policy applies one of its `ops` per sample (optionally with
probabilities `p`). Eval pipelines never contain random ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torchvision.transforms import v2

from turbotrain.core.schema import ConfigError
from turbotrain.data.alternating import AlternatingHorizontalFlip

OWN_OPS = {"AlternatingHorizontalFlip": AlternatingHorizontalFlip}  # turbotrain's, by the same rule


def build_op(spec: Any) -> v2.Transform:
    spec = dict(spec)
    name = spec.pop("name", None)
    if name == "random_choice":
        ops = [build_op(op) for op in spec.pop("ops", [])]
        if not ops:
            raise ConfigError("data.augment: random_choice needs a non-empty `ops` list")
        return v2.RandomChoice(ops, p=spec.pop("p", None))
    op_cls = OWN_OPS.get(str(name)) or getattr(v2, str(name), None)
    if not isinstance(op_cls, type) or not issubclass(op_cls, v2.Transform):
        raise ConfigError(
            f"data.augment: {name!r} is not a torchvision.transforms.v2 transform "
            "(e.g. RandomHorizontalFlip, RandomRotation, ColorJitter, GaussianBlur, "
            "RandAugment, TrivialAugmentWide, RandomResizedCrop, random_choice) nor AlternatingHorizontalFlip"
        )
    try:
        return op_cls(**spec)
    except TypeError as e:
        raise ConfigError(f"data.augment: bad arguments for {name}: {e}") from e


def to_float(mean: Sequence[float], std: Sequence[float]) -> list[v2.Transform]:
    """uint8 image tensor -> normalized float32 (the last two ops of every pipeline)."""
    return [v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))]


def compose(ops: Sequence[v2.Transform]) -> v2.Transform:
    ops = list(ops)
    return v2.Compose(ops) if ops else v2.Identity()
