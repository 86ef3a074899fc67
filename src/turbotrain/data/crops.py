"""RandomResizedCrop's resize for a whole batch of images of different sizes: each crop is
resized with the antialiased bilinear (triangle) filter of torchvision's
`resized_crop(..., antialias=True)`, so a batch is what the per-sample path would give (the boxes
are drawn by RandomResizedCrop itself, data/batched.py).

Two ways to apply that filter, chosen by where the images are: on the CPU, torch's uint8 resize
per crop (its vectorized uint8 kernel is the fastest way we measured, faster than one batched
call); elsewhere (nvJPEG-decoded batches on the GPU) one batched matrix product per axis with
each crop's filter weights, instead of one small kernel launch per image."""

from __future__ import annotations

import torch
from torch.nn import functional as F


def resize_each(images: list[torch.Tensor], boxes: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """A channels-last batch: the uint8 kernel runs on channels-last input, so each crop is copied
    to that layout first (55 vs 75 us per crop, measured), and the batch normalization returns
    the usual layout in the copy it makes anyway."""
    crops = []
    for image, (top, left, h, w) in zip(images, boxes.tolist(), strict=True):
        crop = image[None, :, top : top + h, left : left + w].contiguous(memory_format=torch.channels_last)
        crops.append(F.interpolate(crop, size=size, mode="bilinear", antialias=True))
    return torch.cat(crops)


def filter_weights(start: torch.Tensor, length: torch.Tensor, size: int, extent: int) -> torch.Tensor:
    """[N, size, extent]: output pixel i of crop k averages input pixels [start_k, start_k +
    length_k) of an axis `extent` long with the triangle filter, widened by the scale when it
    shrinks (what keeps a downscale from aliasing), cut at the crop's edges and renormalized:
    the weights torch's antialiased bilinear resize uses."""
    device = start.device
    scale = (length.float() / size)[:, None, None]
    centre = (torch.arange(size, device=device)[None, :, None] + 0.5) * scale
    x = torch.arange(extent, device=device)[None, None, :] - start[:, None, None]
    weights = (1 - ((x + 0.5 - centre) / scale.clamp(min=1)).abs()).clamp_(min=0)
    weights *= (x >= 0) & (x < length[:, None, None])
    return weights / weights.sum(-1, keepdim=True)


def padded_crops(images: list[torch.Tensor], boxes: torch.Tensor) -> torch.Tensor:
    """float [N, C, H, W]: each image's box cut out first, then padded to the largest crop, so one
    large photo in a batch costs its crop, not the whole batch at its size (one 12-megapixel file
    among 64 small ones would pad the batch to about 9 GB)."""
    crops = [i[:, top : top + h, left : left + w] for i, (top, left, h, w) in zip(images, boxes.tolist(), strict=True)]
    hmax, wmax = max(c.shape[-2] for c in crops), max(c.shape[-1] for c in crops)
    return torch.stack([F.pad(c.float(), (0, wmax - c.shape[-1], 0, hmax - c.shape[-2])) for c in crops])


def resize_batched(images: list[torch.Tensor], boxes: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    batch = padded_crops(images, boxes)
    _, _, height, width = boxes.to(batch.device).unbind(1)
    zero = torch.zeros_like(height)  # each crop starts at the padded batch's origin
    rows, cols = filter_weights(zero, height, size[0], batch.shape[-2]), filter_weights(zero, width, size[1], batch.shape[-1])
    out = rows[:, None] @ batch @ cols[:, None].transpose(-1, -2)
    return out.round_().clamp_(0, 255).to(torch.uint8)


def resized_crops(images: list[torch.Tensor], boxes: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """uint8 [N, C, *size]: image k's crop `boxes[k]` (top, left, height, width), resized."""
    return resize_each(images, boxes, size) if images[0].device.type == "cpu" else resize_batched(images, boxes, size)
