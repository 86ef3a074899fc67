"""Augmentation of a whole uint8 batch at once: a tensor [N, C, H, W] from an in-memory store, or
a list of images of different sizes (a decoded cache, nvJPEG batches) when the first op is a
RandomResizedCrop.

Each op with a batch form is split in two: its random draw for one sample, and its application
to the whole batch. The draws are made sample by sample, op by op, from the global RNG: the order
the per-sample path draws them in, so a pipeline of crops, flips and resizes gives exactly the
per-sample path's draws (and, on the CPU, its pixels). Any other op runs per sample after those
draws (with two such random ops, or one of them and a crop or flip, the order differs from the
per-sample path's; the distributions do not). Alternating flips draw nothing: the batch's samples'
indices decide them (data/alternating.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

from turbotrain.data.alternating import AlternatingHorizontalFlip, flips
from turbotrain.data.crops import resized_crops

Images = torch.Tensor | list[torch.Tensor]


class BatchOp(NamedTuple):
    draw: Callable[[tuple[int, int]], Any] | None  # one sample's random draw, from its (h, w)
    apply: Callable[[Images, list], Images]  # the whole batch, given each sample's draw
    coin: float | None = None  # the draw is `torch.rand(1) < coin` alone (a flip's)
    fixed: Callable[[list[int]], list] | None = None  # the batch's draws from its samples' indices, no RNG


def _flipped(dim: int) -> Callable[[torch.Tensor, list[bool]], torch.Tensor]:
    def apply(images: torch.Tensor, chosen: list[bool]) -> torch.Tensor:
        # torch.where, not a boolean index: on a GPU that reads the mask's count back (a sync)
        mask = torch.tensor(chosen).to(images.device, non_blocking=True).view(-1, *[1] * (images.ndim - 1))
        return torch.where(mask, images.flip(dim), images)

    return apply


def _flip(op: v2.Transform, dim: int) -> BatchOp:
    def draw(_shape) -> bool:
        return bool(torch.rand(1) < op.p)  # v2's own test, `rand(1) >= p` skips the flip

    return BatchOp(draw, _flipped(dim), coin=op.p)


def _crop(op: v2.RandomResizedCrop) -> BatchOp:
    def draw(shape: tuple[int, int]) -> list[int]:
        box = op.make_params([torch.empty(0, *shape)])
        return [box["top"], box["left"], box["height"], box["width"]]

    def apply(images: Images, boxes: list[list[int]]) -> torch.Tensor:
        return resized_crops(list(images), torch.tensor(boxes), tuple(op.size))

    return BatchOp(draw, apply)


def _per_sample(op: v2.Transform) -> BatchOp:
    def each(images: Images, _draws) -> torch.Tensor:
        return torch.stack([op(tv_tensors.Image(image)).as_subclass(torch.Tensor) for image in images])

    return BatchOp(None, each)


def batch_op(op: v2.Transform, first: bool) -> BatchOp:
    """`first`: the op sees the images as they come, so a draw from their shape is the one the
    per-sample path makes (after a Resize it would not be)."""
    if type(op) is v2.RandomHorizontalFlip:
        return _flip(op, -1)
    if type(op) is v2.RandomVerticalFlip:
        return _flip(op, -2)
    if type(op) is AlternatingHorizontalFlip:
        return BatchOp(None, _flipped(-1), fixed=flips)
    if first and type(op) is v2.RandomResizedCrop and op.interpolation in ("bilinear", v2.InterpolationMode.BILINEAR):
        return _crop(op)  # both paths antialias (data/crops.py): v2's default, and all we build
    if type(op) is v2.Resize:
        return BatchOp(None, lambda images, _draws: op(images))  # no randomness: one call for the batch
    return _per_sample(op)


class BatchPipeline:
    """The ops as one function of a batch, in two halves that can run in two processes: `draw`
    (the random draws, from the images' sizes alone: a loader worker makes them from the files'
    headers) and `apply` (the pixels: on the device that decodes them)."""

    def __init__(self, steps: list[BatchOp]):
        self.steps = steps
        self.drawing = [step for step in steps if step.draw or step.fixed]
        self.random = [step for step in self.drawing if step.draw]
        coins = [step.coin for step in self.random]
        self.coins = torch.tensor(coins) if all(c is not None for c in coins) else None

    def draw(self, shapes: list[tuple[int, int]], indices: list[int] | None = None) -> list[list]:
        """Each drawing op's draws for the batch of samples `indices` (the ops drawn from them
        need them), made sample by sample, op by op. When every random draw is one `rand(1)`
        (flips), one `rand` of them all: the CPU generator gives the same numbers in the same
        order, without a Python call per sample (about half the batch's data time)."""
        if self.coins is not None:
            drawn = (torch.rand(len(shapes), len(self.coins)) < self.coins).T.tolist()
        else:
            per_sample = [[step.draw(shape) for step in self.random] for shape in shapes]
            drawn = [list(d) for d in zip(*per_sample, strict=True)] if per_sample else [[]] * len(self.random)
        drawn = iter(drawn)
        return [step.fixed(indices) if step.fixed else next(drawn) for step in self.drawing]

    def apply(self, images: Images, draws: list[list]) -> torch.Tensor:
        draws = iter(draws)
        for step in self.steps:
            images = step.apply(images, next(draws) if step.draw or step.fixed else [])
        return images

    def __call__(self, images: Images, indices: list[int] | None = None) -> torch.Tensor:
        if isinstance(images, torch.Tensor):  # one size: no view per sample
            shapes = [tuple(images.shape[-2:])] * len(images)
        else:
            shapes = [tuple(image.shape[-2:]) for image in images]
        return self.apply(images, self.draw(shapes, indices))


def batch_pipeline(ops: Sequence[v2.Transform]) -> BatchPipeline | None:
    """The ops as one function of a batch; None when there are none."""
    steps = [batch_op(op, first=k == 0) for k, op in enumerate(ops)]
    return BatchPipeline(steps) if steps else None


def ops_of(transform: v2.Transform) -> list[v2.Transform]:
    """The ops of a Compose (or of one transform; none for Identity)."""
    if isinstance(transform, v2.Identity):
        return []
    return list(transform.transforms) if isinstance(transform, v2.Compose) else [transform]
