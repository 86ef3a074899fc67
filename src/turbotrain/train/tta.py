"""Test-time augmentation (trainer.tta): validation scores each image by the mean of the softmax
over views of it, the batch itself first."""

from __future__ import annotations

from collections.abc import Callable

import torch


# the views besides the batch itself, per trainer.tta choice (config.TTA_CHOICES)
def shifted(x: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """The batch moved by (dy, dx) pixels (down, right), the border filled by reflection: a crop
    of the padded image, as a training-time random crop of a padded image would take."""
    pad = max(abs(dy), abs(dx))
    h, w = x.shape[-2:]
    padded = torch.nn.functional.pad(x, (pad,) * 4, mode="reflect")
    return padded[..., pad - dy : pad - dy + h, pad - dx : pad - dx + w]


EXTRA_VIEWS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], ...]] = {
    "none": (),
    "flip": (lambda x: x.flip(-1),),  # the mirror image (width is the last dimension)
    # airbench's multi-crop: the image and its mirror, each also shifted one pixel up-left and down-right
    "flip_shift": (
        lambda x: x.flip(-1),
        *(lambda x, d=d: shifted(x, d, d) for d in (-1, 1)),
        *(lambda x, d=d: shifted(x.flip(-1), d, d) for d in (-1, 1)),
    ),
}


def extra_views(tta: str, inputs: torch.Tensor) -> list[torch.Tensor]:
    return [view(inputs) for view in EXTRA_VIEWS[tta]]


def mean_log_softmax(logits: list[torch.Tensor]) -> torch.Tensor:
    """log of the mean softmax over the views' logits (fp32): scores whose argmax, top-k and
    negative log-likelihood are the averaged prediction's."""
    probs = torch.stack([v.float().softmax(-1) for v in logits]).mean(0)
    return probs.clamp_min(torch.finfo(probs.dtype).tiny).log()
