"""Image classifiers: any torchvision classification model by name, or `small_cnn`."""

from __future__ import annotations

import torch
from torch import nn
from torchvision import models as tvm

from turbotrain.config import ConfigError


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


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


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
            _replace(model, name, new)
            return
    raise ConfigError(f"model: found no 3-channel input conv to adapt to {in_channels} channels")


def replace_head(model: nn.Module, num_classes: int) -> None:
    """Replace the last Linear (the classifier in every torchvision classification model)."""
    name, last = next((n, m) for n, m in reversed(list(model.named_modules())) if isinstance(m, nn.Linear))
    _replace(model, name, nn.Linear(last.in_features, num_classes))


def build_model(model_cfg, num_classes: int, in_channels: int) -> nn.Module:
    name = model_cfg.name
    if name == "small_cnn":
        if model_cfg.pretrained:
            raise ConfigError("model.pretrained=true: small_cnn has no pretrained weights")
        return SmallCNN(num_classes, in_channels, model_cfg.width, model_cfg.dropout or 0.0)
    if name not in tvm.list_models(module=tvm):
        raise ConfigError(
            f"model.name={name!r} is not a torchvision classification model (see torchvision.models.list_models()) nor small_cnn"
        )
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
