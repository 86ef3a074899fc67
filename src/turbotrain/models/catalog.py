"""The model registry: which architectures exist, what data each takes, and `build_for`, which
builds the configured one for a dataset."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from turbotrain.core.checkpoint_trust import UntrustedCheckpoint, register_arch_check
from turbotrain.core.registry import Registry
from turbotrain.core.schema import UNIT_HALF_OPEN, setting

MODELS = Registry("model")


@register_arch_check
def _model_fits_kind(arch: dict) -> None:
    name, kind = arch["model"]["name"], arch["kind"]
    if not any(o.kind == kind and o.answers(name) for o in MODELS):
        raise UntrustedCheckpoint(f"arch.model.name={name!r} does not fit arch.kind={kind!r}")


@dataclass
class ModelConfig:
    name: str = "small_cnn"  # the architecture (model=<name>, or model.name=<any torchvision classifier>)
    pretrained: bool = False  # start from the pretrained weights (needs them cached or a network)
    dropout: float | None = setting(None, bound=UNIT_HALF_OPEN)  # None: the architecture's default


@dataclass
class Shape:
    """What a builder needs to know about the data: classes, and image channels or text length."""

    num_classes: int
    in_channels: int = 0  # images
    max_length: int = 0  # text: tokens
    vocab_size: int = 0  # text: the tokenizer's


def build_tokenizer_for(model_cfg, max_length: int):
    """The tokenizer of a text model (its `tokenizer` trait); None for image models."""
    option = MODELS.of(model_cfg)
    return option.traits["tokenizer"](model_cfg, max_length) if option.kind == "text" else None


def build_for(model_cfg, data, tokenizer, max_length: int) -> nn.Module:
    """The configured model for `data` (a DataBundle); refuses a model for the other kind of data."""
    option = MODELS.check_fits(model_cfg, data.kind)
    shape = Shape(data.num_classes, data.in_channels, max_length, len(tokenizer) if tokenizer is not None else 0)
    return option.build(model_cfg, shape)
