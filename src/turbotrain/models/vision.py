"""Image classifiers: any torchvision classification model by name, or `small_cnn`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torchvision import models as tvm

from turbotrain.core.modules import replace_module
from turbotrain.core.schema import POSITIVE, UNIT_HALF_OPEN, ConfigError, setting
from turbotrain.models.catalog import MODELS, ModelConfig, Shape


@dataclass
class SmallCNNConfig(ModelConfig):
    width: int = setting(32, bound=POSITIVE)  # channels of the first convolution (the others are multiples)
    dropout: float | None = setting(0.1, bound=UNIT_HALF_OPEN)


def _block(cin: int, cout: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


class SmallCNN(nn.Sequential):
    """Five conv/BN/ReLU blocks, two poolings, global average pool: ~0.3M params at width 32."""

    def __init__(self, num_classes: int, in_channels: int = 1, width: int = 32, dropout: float = 0.0):
        w = width
        super().__init__(
            *_block(in_channels, w),
            *_block(w, w),
            nn.MaxPool2d(2),
            *_block(w, 2 * w),
            *_block(2 * w, 2 * w),
            nn.MaxPool2d(2),
            *_block(2 * w, 4 * w),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Dropout(dropout),
            nn.Linear(4 * w, num_classes),
        )


def adapt_input_channels(model: nn.Module, in_channels: int) -> None:
    """Swap the first 3-channel conv for one taking `in_channels` (pretrained RGB
    filters are summed over channels and spread evenly, so greyscale inputs see
    the same response as a grey RGB image)."""
    for name, m in model.named_modules():
        if isinstance(m, nn.Conv2d) and m.in_channels == 3:
            new = nn.Conv2d(
                in_channels,
                m.out_channels,
                m.kernel_size,
                m.stride,
                m.padding,
                m.dilation,
                m.groups,
                m.bias is not None,
            )
            with torch.no_grad():
                new.weight.copy_(m.weight.sum(1, keepdim=True).expand_as(new.weight) / in_channels)
                if m.bias is not None:
                    new.bias.copy_(m.bias)
            replace_module(model, name, new)
            return
    raise ConfigError(f"model: found no 3-channel input conv to adapt to {in_channels} channels")


def replace_head(model: nn.Module, num_classes: int) -> None:
    """Replace the last Linear (the classifier in every torchvision classification model)."""
    name, last = next((n, m) for n, m in reversed(list(model.named_modules())) if isinstance(m, nn.Linear))
    replace_module(model, name, nn.Linear(last.in_features, num_classes))


def build_model(model_cfg, num_classes: int, in_channels: int) -> nn.Module:
    """An image classifier for `num_classes` classes and `in_channels` input channels."""
    return MODELS.check_fits(model_cfg, "image").build(model_cfg, Shape(num_classes, in_channels=in_channels))


@MODELS.register("small_cnn", SmallCNNConfig, kind="image")
def small_cnn(model_cfg, shape: Shape) -> nn.Module:
    if model_cfg.pretrained:
        raise ConfigError("model.pretrained=true: small_cnn has no pretrained weights")
    return SmallCNN(shape.num_classes, shape.in_channels, model_cfg.width, model_cfg.dropout or 0.0)


def _torchvision_names() -> list[str]:
    return tvm.list_models(module=tvm)


@MODELS.register(
    "torchvision",
    ModelConfig,
    kind="image",
    family=_torchvision_names,
    family_doc="any torchvision classifier by name (resnet18, resnet50, ...: torchvision.models.list_models())",
)
def torchvision_model(model_cfg, shape: Shape) -> nn.Module:
    name, num_classes, in_channels = model_cfg.name, shape.num_classes, shape.in_channels
    if model_cfg.pretrained:
        try:
            model = tvm.get_model(name, weights="DEFAULT")
        except Exception as e:  # download / hash / offline errors come in many types
            raise ConfigError(
                f"model.pretrained=true: could not load pretrained weights for {name} "
                f"({type(e).__name__}: {e}). Put the file in $TORCH_HOME/hub/checkpoints/ "
                "or set model.pretrained=false"
            ) from e
        replace_head(model, num_classes)
    else:
        kwargs = {} if model_cfg.dropout is None else {"dropout": model_cfg.dropout}
        try:
            model = tvm.get_model(name, weights=None, num_classes=num_classes, **kwargs)
        except TypeError as e:
            raise ConfigError(f"model.dropout: {name} takes no dropout argument ({e}); leave it null") from e
    if in_channels != 3:
        adapt_input_channels(model, in_channels)
    return model
