"""Attention for transformer encoders: implementation choice, sliding-window attention, gradient
checkpointing, and extension of learned position embeddings.

Sliding-window attention is registered with transformers' `AttentionInterface` (the kernel) and
`AttentionMaskInterface` (which hands the kernel the 2-D padding mask instead of an n x n bias), so
any model that dispatches through those interfaces (BERT and its family) uses it unchanged.
The kernel is in `sliding_window.py`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

from turbotrain.core.registry import Registry
from turbotrain.core.schema import NON_NEGATIVE, POSITIVE, UNIT_HALF_OPEN, ConfigError, setting
from turbotrain.models.attention.sliding_window import sliding_window_attention

log = logging.getLogger("turbotrain")
NAME = "turbotrain_sliding_window"


def _hf_kernel(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    cfg = module.config.turbotrain_attention
    out = sliding_window_attention(
        query,
        key,
        value,
        attention_mask,
        window=cfg["window"],
        block=cfg["block"],
        global_tokens=cfg["global_tokens"],
        dropout=dropout,
        scaling=scaling,
        training=module.training,
    )
    return out, None


def _hf_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, attention_mask=None, **kwargs):
    """No n x n mask: the kernel takes the 2-D padding mask (None when there is no padding)."""
    if attention_mask is None or bool(attention_mask.all()):
        return None
    return attention_mask[:, kv_offset : kv_offset + kv_length].bool()


def _register_kernel() -> None:
    """Make NAME a transformers attention implementation (imported here: text runs only)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, _hf_kernel)
    AttentionMaskInterface.register(NAME, _hf_mask)


def extend_positions(model: nn.Module, max_length: int) -> int:
    """Grow learned absolute position embeddings to `max_length` by tiling the trained ones
    (Longformer's copy initialization). Returns how many positions were added."""
    emb = getattr(getattr(model, "base_model", model), "embeddings", None)
    pos = getattr(emb, "position_embeddings", None)
    if not isinstance(pos, nn.Embedding):
        raise ConfigError(
            f"data.max_length={max_length} exceeds the model's positions and it has no learned "
            "absolute position embeddings to extend; lower data.max_length"
        )
    old = pos.num_embeddings
    if max_length <= old:
        return 0
    new = nn.Embedding(max_length, pos.embedding_dim, padding_idx=pos.padding_idx)
    with torch.no_grad():
        reps = -(-max_length // old)
        new.weight.copy_(pos.weight.repeat(reps, 1)[:max_length])
    emb.position_embeddings = new
    for name in ("position_ids", "token_type_ids"):
        buf = getattr(emb, name, None)
        if buf is not None:
            grown = torch.arange(max_length).expand(1, -1) if name == "position_ids" else buf.new_zeros(1, max_length)
            emb.register_buffer(name, grown.to(buf.dtype), persistent=False)
    model.config.max_position_embeddings = max_length
    return max_length - old


ATTENTION = Registry("attention")


@dataclass
class AttentionConfig:
    name: str = "full"  # the option (attention=<name>)
    checkpointing: bool = False  # gradient checkpointing of encoder layers
    dropout: float | None = setting(None, bound=UNIT_HALF_OPEN)  # None: the model's (0 lets SDPA use its fused kernel)


@dataclass
class FullAttentionConfig(AttentionConfig):
    # the full attention kernel (an autotune knob)
    implementation: str = setting("sdpa", choices=("sdpa", "eager"), numeric=False)


@dataclass
class SlidingWindowConfig(AttentionConfig):
    window: int = setting(256, bound=POSITIVE)  # tokens each side
    block: int | None = setting(None, bound=POSITIVE)  # query block (None: window; fastest measured at 2048 tokens)
    global_tokens: int = setting(1, bound=NON_NEGATIVE)  # leading tokens ([CLS]) that attend and are attended globally
    # 0, not the model's (0.1 for BERT): dropout forces the unfused path, several times slower
    dropout: float | None = setting(0.0, bound=UNIT_HALF_OPEN)


def apply_attention(model: nn.Module, attention_cfg, kind: str = "text") -> dict:
    """Set attention dropout, the attention kernel and gradient checkpointing of a transformer
    (`kind` text); image models take only attention=full without checkpointing. Returns what changed."""
    ATTENTION.check_fits(attention_cfg, kind)
    if kind != "text":
        if attention_cfg.checkpointing:
            raise ConfigError("attention.checkpointing=true applies to transformer models only")
        return {}
    changed: dict = {"implementation": attention_cfg.name}
    if attention_cfg.dropout is not None:
        changed.update(attention_dropout=attention_cfg.dropout, dropout_modules=_set_dropout(model, attention_cfg.dropout))
    ATTENTION.of(attention_cfg).build(model, attention_cfg)
    if attention_cfg.checkpointing:
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise ConfigError(f"attention.checkpointing=true: {type(model).__name__} does not support it")
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        changed["checkpointing"] = True
    return changed


ATTENTION_DROPOUT = "attention.self.dropout"  # the name ending of the attention probabilities' dropout


def _set_dropout(model: nn.Module, p: float) -> int:
    model.config.attention_probs_dropout_prob = p
    n = 0
    for name, m in model.named_modules():
        if isinstance(m, nn.Dropout) and name.endswith(ATTENTION_DROPOUT):
            m.p = p
            n += 1
    return n


@ATTENTION.register("full", FullAttentionConfig, kernels=("sdpa", "eager"))
def full(model: nn.Module, c) -> None:
    model.set_attn_implementation(c.implementation)


@ATTENTION.register("sliding_window", SlidingWindowConfig, kind="text", approximates="full")
def sliding_window(model: nn.Module, c) -> None:
    _register_kernel()
    p = getattr(model.config, "attention_probs_dropout_prob", 0.0) if c.dropout is None else c.dropout
    if p > 0:
        log.warning(
            "attention.dropout=%s: sliding-window attention runs unfused, several times slower (0 keeps the fused kernel)", p
        )
    model.config.turbotrain_attention = {"window": c.window, "block": c.block or c.window, "global_tokens": c.global_tokens}
    model.set_attn_implementation(NAME)
