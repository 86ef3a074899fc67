"""The sliding-window attention kernel: token i attends to tokens j with |i - j| <= window, plus
the first `global_tokens` tokens ([CLS]), which also attend to everything.

Queries go in blocks; each block sees its keys as a strided view (no n x n work, no per-block
key/value copies) and is one batch entry of a fused attention kernel. On CPU without attention
dropout that is torch's flash kernel inside one autograd function (`sliding_window_cpu.py`)
that keeps no more for backward than fused full attention. Elsewhere (CUDA, attention dropout)
the views go through the public scaled_dot_product_attention over one padded copy of the keys
and values in which every block follows a copy of the global keys; autograd keeps the mask.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch.nn import functional as F

from turbotrain.models.attention.sliding_window_cpu import FlashBands
from turbotrain.models.attention.sliding_window_layout import Layout, band_mask, global_mask


def sliding_window_attention(
    query: torch.Tensor,  # [b, h, n, d]
    key: torch.Tensor,
    value: torch.Tensor,
    padding_mask: torch.Tensor | None,  # [b, n], True/1 = real token
    *,
    window: int,
    block: int,
    global_tokens: int = 0,
    dropout: float = 0.0,
    scaling: float | None = None,
    training: bool = False,
) -> torch.Tensor:
    """Returns [b, n, h, d] like transformers' attention functions. Outputs at padding positions
    are unspecified (callers drop them)."""
    b, h, n, d = query.shape
    p = dropout if training else 0.0
    scaling = d**-0.5 if scaling is None else scaling
    keep = torch.ones(b, n, dtype=torch.bool, device=query.device) if padding_mask is None else padding_mask.bool()
    if n - 1 <= window:  # every pair is within the window: this is full attention
        mask = None if padding_mask is None else keep[:, None, None, :]
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=p, scale=scaling).transpose(1, 2)
    lay = Layout(b, n, h, d, window, max(1, min(block, n)), global_tokens)
    if query.device.type == "cpu" and p == 0.0:
        return FlashBands.apply(query, key, value, keep, replace(lay, g=0), global_tokens, scaling)[:, :n]
    qp = query.transpose(1, 2)  # [b, n, h, d]: a view when the projection made [b, n, h * d]
    if lay.n_pad > n:
        qp = F.pad(qp, (0, 0, 0, 0, 0, lay.n_pad - n))
    return _sdpa_bands(qp, lay.flat(key), lay.flat(value), keep, lay, scaling, p)[:, :n]


def _sdpa_bands(qp, kf, vf, keep, lay: Layout, scaling: float, p: float) -> torch.Tensor:
    """The blocks through torch's public attention (any device, dropout): autograd saves the mask."""
    out = F.scaled_dot_product_attention(
        lay.queries(qp), lay.bands(kf), lay.bands(vf), attn_mask=band_mask(keep, lay), dropout_p=p, scale=scaling
    )
    out = out.transpose(1, 2).reshape(lay.b, lay.n_pad, lay.h, lay.d)
    if not lay.g:
        return out
    q_g = qp[:, : lay.g].transpose(1, 2)
    g_out = F.scaled_dot_product_attention(
        q_g, lay.whole(kf), lay.whole(vf), attn_mask=global_mask(keep, lay), dropout_p=p, scale=scaling
    )
    return torch.cat([g_out.transpose(1, 2), out[:, lay.g :]], dim=1)
