"""References for the sliding-window kernel: the dense n x n banded mask, and the kernel that
copied each block's key span (turbotrain's first, kept to test its replacement against)."""

from __future__ import annotations

import torch
from torch.nn import functional as F


def naive_banded(q, k, v, keep, window, global_tokens=0):
    """Dense n x n reference: the O(n^2) mask the kernel must never build."""
    n = q.shape[2]
    i = torch.arange(n)
    allowed = (i[:, None] - i[None, :]).abs() <= window
    allowed[:global_tokens, :] = True
    allowed[:, :global_tokens] = True
    allowed = allowed[None, None] & keep[:, None, None, :]
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    s = s.masked_fill(~allowed, torch.finfo(s.dtype).min)
    return (s.softmax(-1) @ v).transpose(1, 2)


def copying_kernel(
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
    """turbotrain's first sliding-window kernel: each query block's key span (band + global
    keys) copied out of the padded keys (3x the keys at block = window), then one SDPA batch
    entry per block. Tested equal to the dense banded mask; the kernel that replaced it must equal it."""
    b, h, n, d = query.shape
    scaling = d**-0.5 if scaling is None else scaling
    blk = max(1, min(block, n))
    blocks = -(-n // blk)
    n_pad = blocks * blk
    span = blk + 2 * window
    dev = query.device
    keep = torch.ones(b, n, dtype=torch.bool, device=dev) if padding_mask is None else padding_mask.bool()

    def band(x: torch.Tensor) -> torch.Tensor:  # [b, h, n, d] -> [b * blocks, h, span, d]
        x = F.pad(x, (0, 0, window, n_pad - n + window)).unfold(2, span, blk)  # [b, h, blocks, d, span]
        return x.permute(0, 2, 1, 4, 3).reshape(b * blocks, h, span, d)

    q = F.pad(query, (0, 0, 0, n_pad - n)).view(b, h, blocks, blk, d).transpose(1, 2).reshape(b * blocks, h, blk, d)
    k, v = band(key), band(value)
    # Which keys each query may see: inside the band, real (not padding, not past the ends) and,
    # with global tokens, not a global key (those are appended once per block, below). A query
    # always sees itself, so no row is empty (padding queries' outputs are dropped anyway).
    key_ok = F.pad(keep, (window, n_pad - n + window)).unfold(1, span, blk)  # [b, blocks, span]
    offset = torch.arange(span, device=dev)[None, :] - torch.arange(blk, device=dev)[:, None]
    in_band = (offset >= 0) & (offset <= 2 * window)  # |query - key| <= window
    allowed = key_ok[:, :, None, :] & in_band  # [b, blocks, blk, span]
    if global_tokens:
        key_pos = torch.arange(blocks, device=dev)[:, None] * blk - window + torch.arange(span, device=dev)
        allowed = allowed & (key_pos >= global_tokens)[None, :, None, :]
        g_ok = keep[:, None, None, :global_tokens].expand(b, blocks, blk, global_tokens)
        allowed = torch.cat([allowed, g_ok], dim=-1)
        g_k, g_v = (t[:, :, :global_tokens].repeat_interleave(blocks, dim=0) for t in (key, value))
        k, v = torch.cat([k, g_k], dim=2), torch.cat([v, g_v], dim=2)
    allowed = allowed | F.pad(offset == window, (0, allowed.shape[-1] - span))
    mask = allowed.reshape(b * blocks, 1, blk, -1)
    p = dropout if training else 0.0
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, scale=scaling)  # [b*blocks, h, blk, d]
    out = out.view(b, blocks, h, blk, d).transpose(1, 2).reshape(b, h, n_pad, d)[:, :, :n]
    if global_tokens:  # global queries attend to every real token: full rows, O(n * global_tokens)
        g_mask = keep[:, None, None, :] | (torch.arange(n, device=dev) < global_tokens)  # never an empty row
        g = F.scaled_dot_product_attention(query[:, :, :global_tokens], key, value, attn_mask=g_mask, dropout_p=p, scale=scaling)
        out = torch.cat([g, out[:, :, global_tokens:]], dim=2)
    return out.transpose(1, 2).contiguous()
