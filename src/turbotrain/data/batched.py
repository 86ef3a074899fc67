"""Augmentation of a whole uint8 batch [N, C, H, W] at once, for in-memory image data.

A batch is one index into the tensor store (TensorImageDataset.__getitems__), and its ops run on
the batch: flips draw one number per sample for the whole batch, in the order the per-sample path
draws them, so a pipeline whose only random op is a flip gives exactly the per-sample path's
images; Resize has no randomness and runs on the batch as it is. Any other op runs per sample
(same draws as before, op by op). With two or more random ops the batch path draws the same
distributions in a different order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

BatchOp = Callable[[torch.Tensor], torch.Tensor]


def _flip(p: float, dim: int) -> BatchOp:
    def flip(images: torch.Tensor) -> torch.Tensor:
        chosen = torch.rand(len(images)) < p  # v2's per-sample test, `rand(1) < p`, for each sample in turn
        if chosen.any():
            images = images.clone()
            images[chosen] = images[chosen].flip(dim)
        return images

    return flip


def _per_sample(op: v2.Transform) -> BatchOp:
    def each(images: torch.Tensor) -> torch.Tensor:
        return torch.stack([op(tv_tensors.Image(image)).as_subclass(torch.Tensor) for image in images])

    return each


def batch_op(op: v2.Transform) -> BatchOp:
    if type(op) is v2.RandomHorizontalFlip:
        return _flip(op.p, -1)
    if type(op) is v2.RandomVerticalFlip:
        return _flip(op.p, -2)
    if type(op) is v2.Resize:
        return op  # deterministic: the same for every image of the batch
    return _per_sample(op)


def batch_pipeline(ops: Sequence[v2.Transform]) -> BatchOp | None:
    """The ops as one function of a uint8 batch; None when there are none."""
    steps = [batch_op(op) for op in ops]
    if not steps:
        return None

    def pipeline(images: torch.Tensor) -> torch.Tensor:
        for step in steps:
            images = step(images)
        return images

    return pipeline


def ops_of(transform: v2.Transform) -> list[v2.Transform]:
    """The ops of a Compose (or of one transform; none for Identity)."""
    if isinstance(transform, v2.Identity):
        return []
    return list(transform.transforms) if isinstance(transform, v2.Compose) else [transform]
