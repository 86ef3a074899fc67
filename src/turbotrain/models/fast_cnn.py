"""`fast_cnn`: a small network built for time to accuracy on small images.

A patch-whitening first layer (models/whitening.py), then one block per width: a 3x3 conv, a
2x2 max-pool, BatchNorm and ReLU (pooling before the norm and activation does them on a
quarter of the pixels), a global max-pool and a linear classifier. At the default widths
(32, 64, 128) on 28 px images: 0.1M parameters, ~15 MFLOPs per image.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from turbotrain.core.schema import POSITIVE, ConfigError, setting
from turbotrain.models.catalog import MODELS, ModelConfig, Shape
from turbotrain.models.whitening import PatchWhitening


@dataclass
class FastCNNConfig(ModelConfig):
    widths: list[int] = setting(bound=POSITIVE, factory=lambda: [32, 64, 128])  # one conv/pool/BN/ReLU block each
    stem_patch: int = setting(2, bound=POSITIVE)  # the first layer's kernel: 2 * channels * patch^2 outputs, no padding
    whiten: bool = True  # the first layer's filters whiten the training images' patches, frozen; false: learned
    # each block's conv starts as the identity on its first input-many output channels (airbench's
    # dirac init): a deep net starts as a shallow one, the rest of the filters as torch draws them
    dirac: bool = False


def _block(cin: int, cout: int, dirac: bool) -> list[nn.Module]:
    conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
    if dirac:
        with torch.no_grad():
            nn.init.dirac_(conv.weight[: min(cin, cout)])
    return [conv, nn.MaxPool2d(2), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


class FastCNN(nn.Sequential):
    def __init__(self, num_classes: int, in_channels: int, widths: list[int], stem_patch: int, whiten: bool, dirac: bool = False):
        cin = 2 * in_channels * stem_patch * stem_patch
        # whiten=false: the same shape of layer, learned from torch's default init
        stem = PatchWhitening(in_channels, stem_patch) if whiten else nn.Conv2d(in_channels, cin, stem_patch)
        layers = [stem, nn.ReLU(inplace=True)]
        for width in widths:
            layers += _block(cin, width, dirac)
            cin = width
        super().__init__(*layers, nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes, bias=False))


@MODELS.register("fast_cnn", FastCNNConfig, kind="image")
def fast_cnn(model_cfg, shape: Shape) -> nn.Module:
    if model_cfg.pretrained:
        raise ConfigError("model.pretrained=true: fast_cnn has no pretrained weights")
    if model_cfg.dropout:
        raise ConfigError("model.dropout: fast_cnn has no dropout; leave it null")
    c = model_cfg
    return FastCNN(shape.num_classes, shape.in_channels, list(c.widths), c.stem_patch, c.whiten, c.dirac)
