"""The CPU band kernel's fast case: block = window, every key real (no padding), the length a
multiple of the block. Query block J then sees exactly three key blocks: all of J, the keys of
J + 1 at or before its own position (a triangle), and the keys of J - 1 at or after it. Two calls
of torch's flash kernel cover them, on views of the keys themselves: J against J and J + 1 (one
strided view of both) under a mask that cuts the second block's triangle, and J against J - 1
under the mirrored mask. Both masks are one [block, 2 block] or [block, block] tensor broadcast
to every block and head. (A causal call would save nothing here: torch's kernel skips only whole
512-key tiles, so a triangle costs a full block either way.)

The two parts are merged through their log-sum-exps; the flash backward of each part, given the
merged output and log-sum-exp, is that part's share of the exact gradient. Query blocks go in
groups of GROUP within one sequence, which bounds the transient per call.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from turbotrain.sliding_window_layout import Layout, additive

flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
GROUP = 8  # query blocks per call at most


def fits(keep: torch.Tensor, lay: Layout) -> bool:
    return lay.blk == lay.window and lay.n == lay.n_pad and lay.blocks >= 2 and bool(keep.all())


def _pairs(x: torch.Tensor) -> torch.Tensor:
    """[blocks, h, blk, d] block views -> [blocks - 1, h, 2 blk, d]: block J with J + 1, a view
    (the blocks' rows follow each other in the keys' storage)."""
    blocks, h, blk, d = x.shape
    assert x.stride(0) == blk * x.stride(2), "block views of one key tensor"
    return x.as_strided((blocks - 1, h, 2 * blk, d), x.stride(), x.storage_offset())


def _masks(lay: Layout, dtype: torch.dtype, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The pair call's mask (all of J; J + 1's keys at or before the query) and the previous
    block's (its keys at or after the query), broadcast to `groups` blocks and every head."""
    i = torch.arange(lay.blk)
    lower = i[None, :] <= i[:, None]  # [query, key]: key at or before the query
    pair = torch.cat([torch.ones_like(lower), lower], dim=1)
    upper = i[None, :] >= i[:, None]
    return tuple(additive(m, dtype).expand(groups, lay.h, *m.shape) for m in (pair, upper))


def _parts(lay: Layout) -> Iterator[tuple[int, int, int, int]]:
    """Per group of query blocks [a, z) of one sequence: (a, z, c, p) where the pair part covers
    queries [a, c) (the sequence's last block has no next: its own keys alone), and the
    previous-block part queries [p, z)."""
    for s in range(lay.b):
        lo, hi = s * lay.blocks, (s + 1) * lay.blocks
        for a in range(lo, hi, GROUP):
            z = min(a + GROUP, hi)
            yield a, z, min(z, hi - 1), max(a, lo + 1)


def forward(q, k, v, out: torch.Tensor, lse: torch.Tensor, scaling: float, lay: Layout) -> None:
    """q, k, v: [b * blocks, h, blk, d] views; fills `out` [b * blocks, blk, h, d] and `lse`
    [b * blocks, h, blk]."""
    kp, vp = _pairs(k), _pairs(v)
    pair_mask, prev_mask = _masks(lay, q.dtype, GROUP)
    for a, z, c, p in _parts(lay):
        o, m = flash(q[a:c], kp[a:c], vp[a:c], attn_mask=pair_mask[: c - a], scale=scaling)
        if c < z:  # the sequence's last block
            o_last, m_last = flash(q[c:z], k[c:z], v[c:z], scale=scaling)
            o, m = torch.cat([o, o_last]), torch.cat([m, m_last])
        o_prev, m_prev = flash(q[p:z], k[p - 1 : z - 1], v[p - 1 : z - 1], attn_mask=prev_mask[: z - p], scale=scaling)
        merged = m.clone()
        merged[p - a :] = torch.logaddexp(m[p - a :], m_prev)
        total = o.to(merged.dtype) * torch.exp(m - merged)[..., None]  # the kernel's accumulation type
        total[p - a :] += o_prev.to(merged.dtype) * torch.exp(m_prev - merged[p - a :])[..., None]
        out[a:z], lse[a:z] = total.transpose(1, 2), merged


def backward(grad, q, k, v, out, lse, scaling: float, lay: Layout) -> tuple[torch.Tensor, ...]:
    """grad and out: [b * blocks, h, blk, d] views, like q, k, v; returns dq, dk, dv in the
    [b * blocks, blk, h, d] layout. Every block's gradient is first written by its own part,
    then the neighbours' parts add theirs: the groups go last to first (a pair part adds to the
    next group's first block), and the previous-block parts come after all of them."""
    dq, dk, dv = (torch.empty(lay.b * lay.blocks, lay.blk, lay.h, lay.d, dtype=q.dtype) for _ in range(3))
    dq4, dk4, dv4 = (t.transpose(1, 2) for t in (dq, dk, dv))
    kp, vp = _pairs(k), _pairs(v)
    pair_mask, prev_mask = _masks(lay, q.dtype, GROUP)
    blk = lay.blk
    for a, z, c, _ in reversed(list(_parts(lay))):
        if c < z:
            dq4[c:z], dk4[c:z], dv4[c:z] = flash_backward(
                grad[c:z], q[c:z], k[c:z], v[c:z], out[c:z], lse[c:z], 0.0, False, scale=scaling
            )  # fmt: skip
        gq, gk, gv = flash_backward(
            grad[a:c], q[a:c], kp[a:c], vp[a:c], out[a:c], lse[a:c], 0.0, False, attn_mask=pair_mask[: c - a], scale=scaling
        )  # fmt: skip
        dq4[a:c] = gq
        dk4[a:c], dv4[a:c] = gk[:, :, :blk], gv[:, :, :blk]
        dk4[a + 1 : c + 1] += gk[:, :, blk:]
        dv4[a + 1 : c + 1] += gv[:, :, blk:]
    for _, z, _, p in _parts(lay):
        keys = slice(p - 1, z - 1)
        gq, gk, gv = flash_backward(
            grad[p:z], q[p:z], k[keys], v[keys], out[p:z], lse[p:z], 0.0, False, attn_mask=prev_mask[: z - p], scale=scaling
        )  # fmt: skip
        dq4[p:z] += gq
        dk4[keys] += gk
        dv4[keys] += gv
    return dq, dk, dv
