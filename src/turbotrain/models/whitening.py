"""A first layer fitted to the data: frozen filters that whiten the input's patches.

Every k x k patch of the training images, seen as a vector, is decorrelated and scaled to unit
variance by the eigenvectors of the patches' covariance (divided by the square root of their
eigenvalues). The next layers then start from inputs whose directions all carry the same
signal, which is what lets a small network learn in a couple of epochs (airbench's first
layer). Each filter comes with its negative, so a ReLU after the layer keeps both signs. The
layer does not train: its filters are fitted once, on training images, before the first step,
and with nothing below it to learn, backward stops at the next layer (measured: a tenth of
fast_cnn's step, at the same accuracy as a trained bias).
"""

from __future__ import annotations

import torch
from torch import nn

FIT_IMAGES = 512  # images sampled evenly through the training set: hundreds of patches each
EPS = 1e-2  # added to the eigenvalues: the near-empty directions are not blown up into noise


class PatchWhitening(nn.Module):
    """A k x k convolution without padding or bias, 2 * in_channels * k * k outputs, frozen."""

    def __init__(self, in_channels: int, patch: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, 2 * in_channels * patch * patch, patch, bias=False)
        self.conv.weight.requires_grad_(False)

    @torch.no_grad()
    def fit(self, images: torch.Tensor) -> None:
        """Set the filters from `images` [N, C, H, W], normalized as the model will see them."""
        c, k = self.conv.in_channels, self.conv.kernel_size[0]
        patches = images.float().unfold(2, k, 1).unfold(3, k, 1)  # N, C, H', W', k, k
        patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(-1, c * k * k)
        eigenvalues, eigenvectors = torch.linalg.eigh(torch.cov(patches.T.double()))
        filters = (eigenvectors / torch.sqrt(eigenvalues.clamp_min(0) + EPS)).T.reshape(-1, c, k, k)
        self.conv.weight.copy_(torch.cat([filters, -filters]).to(self.conv.weight))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def fit_whitening(model: nn.Module, data) -> None:
    """Fit every PatchWhitening of `model` (its first layer: it sees the input images) on
    FIT_IMAGES training images of `data` (a DataBundle). Does nothing, and reads no image, for
    other models."""
    layers = [m for m in model.modules() if isinstance(m, PatchWhitening)]
    if layers:
        batch = _training_images(data, FIT_IMAGES)
        for layer in layers:
            layer.fit(batch)


def _training_images(data, n: int) -> torch.Tensor:
    """n training images spread evenly through the set (a folder's are sorted by class), as the
    model sees them in validation: resized and normalized, unaugmented."""
    dataset = data.train_eval if data.train_eval is not None else data.train
    stride = max(1, len(dataset) // n)
    return data.collate([dataset[i] for i in range(0, len(dataset), stride)][:n])[0]
