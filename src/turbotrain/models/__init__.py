"""Models: `build_model(cfg.model, num_classes, in_channels)`."""

from turbotrain.models.vision import build_model

__all__ = ["build_model"]
