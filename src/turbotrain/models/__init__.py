"""Models: the registry and builders (catalog), image and text architectures, and rebuilding a
saved run's exact architecture (saved)."""

from turbotrain.models import fast_cnn, text, vision  # each registers its architectures in MODELS
from turbotrain.models.catalog import MODELS, ModelConfig, Shape, build_for, build_tokenizer_for
from turbotrain.models.saved import architecture, from_checkpoint, load_weights
from turbotrain.models.vision import build_model

__all__ = [
    "MODELS",
    "ModelConfig",
    "Shape",
    "architecture",
    "build_for",
    "build_model",
    "build_tokenizer_for",
    "fast_cnn",
    "from_checkpoint",
    "load_weights",
    "text",
    "vision",
]
