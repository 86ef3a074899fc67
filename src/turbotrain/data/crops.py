"""RandomResizedCrop for a whole batch of images of different sizes: the boxes are drawn per
sample (torchvision's own sampler, from the global RNG: seeded and saved with the run), and all
crops are resized in one call of torchvision's roi_align. Its adaptive sampling averages
ceil(box / output) bilinear samples per output pixel in each direction, which is what keeps a
large downscale from aliasing (the job antialias=True does in torchvision's resize)."""

from __future__ import annotations

import torch
from torch.nn import functional as F
from torchvision import transforms as v1
from torchvision.ops import roi_align

SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)  # RandomResizedCrop's defaults


def draw_boxes(shapes: list[tuple[int, int]], scale=SCALE, ratio=RATIO) -> torch.Tensor:
    """One (top, left, height, width) per image of size (h, w), as RandomResizedCrop draws them."""
    boxes = [v1.RandomResizedCrop.get_params(torch.empty(0, h, w), list(scale), list(ratio)) for h, w in shapes]
    return torch.tensor(boxes, dtype=torch.float32)


def _stack_padded(images: list[torch.Tensor]) -> torch.Tensor:
    """[N, C, Hmax, Wmax] float; edges replicated, so bilinear samples at a border see the border."""
    hmax, wmax = max(i.shape[-2] for i in images), max(i.shape[-1] for i in images)
    padded = [
        F.pad(i[None].float(), (0, wmax - i.shape[-1], 0, hmax - i.shape[-2]), mode="replicate")
        if i.shape[-2:] != (hmax, wmax)
        else i[None].float()
        for i in images
    ]
    return torch.cat(padded)


def resized_crops(images: list[torch.Tensor], boxes: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 [N, C, size, size]: image k's crop `boxes[k]` (top, left, height, width), resized."""
    batch = _stack_padded(images)
    top, left, height, width = boxes.to(batch.device).unbind(1)
    index = torch.arange(len(images), dtype=batch.dtype, device=batch.device)
    rois = torch.stack([index, left, top, left + width, top + height], dim=1)
    out = roi_align(batch, rois, output_size=(size, size), spatial_scale=1.0, sampling_ratio=-1, aligned=True)
    return out.round_().clamp_(0, 255).to(torch.uint8)


def random_resized_crops(images: list[torch.Tensor], size: int) -> torch.Tensor:
    return resized_crops(images, draw_boxes([tuple(i.shape[-2:]) for i in images]), size)
