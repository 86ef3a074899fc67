"""The CPU band kernel's fast case: block = window, every key real (no padding), the length a
multiple of the block. Query block J then sees exactly three key blocks: the keys of J - 1 at or
after its own position (a triangle), all of J, and the keys of J + 1 at or before it. One call of
torch's flash kernel covers them, on a strided view of the keys themselves (blocks J - 1 .. J + 1
follow each other in the keys' storage) under one [block, 3 block] mask broadcast to every block
and head. A sequence's first and last blocks see two blocks, with their own masks.

One call per block, not one per triangle: a block's output and log-sum-exp come out whole, with
no merge (and in bf16, rounded once). Splitting the triangles off saves no work: torch's kernel
skips none inside its 512-key tiles, so a triangle costs a full block either way (the whole
kernel took the same time with two calls per block: 173 vs 172 ms fwd+bwd on MiniLM's shapes).
FlexAttention, which skips masked tiles, has no backward on CPU (bench/attention_flex.py).
Query blocks go in groups of GROUP within one sequence, which bounds the transient key gradients
per call.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from turbotrain.models.attention.sliding_window_layout import Layout, additive

flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
GROUP = 8  # query blocks per call at most


def fits(keep: torch.Tensor, lay: Layout) -> bool:
    return lay.blk == lay.window and lay.n == lay.n_pad and lay.blocks >= 2 and bool(keep.all())


def _spans(x: torch.Tensor, count: int) -> torch.Tensor:
    """[blocks, h, blk, d] block views -> [blocks - count + 1, h, count * blk, d]: entry j is
    blocks j .. j + count - 1, a view (the blocks' rows follow each other in the keys' storage)."""
    blocks, h, blk, d = x.shape
    assert x.stride(0) == blk * x.stride(2), "block views of one key tensor"
    return x.as_strided((blocks - count + 1, h, count * blk, d), x.stride(), x.storage_offset())


def _masks(lay: Layout, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The mask over a call's keys, broadcast to GROUP blocks and every head: "band" over blocks
    J - 1 .. J + 1, "first" (a sequence's first block) over J and J + 1, "last" over J - 1 and J."""
    i = torch.arange(lay.blk)
    before, after = i[None, :] <= i[:, None], i[None, :] >= i[:, None]  # [query, key]: key at or before / after
    every = torch.ones_like(before)
    masks = {"band": [after, every, before], "first": [every, before], "last": [after, every]}
    return {k: additive(torch.cat(m, 1), dtype).expand(GROUP, lay.h, lay.blk, -1) for k, m in masks.items()}


def _calls(lay: Layout) -> Iterator[tuple[int, int, int, str]]:
    """Per kernel call: (a, z, first, mask): query blocks [a, z) see the keys of the blocks from
    their own + `first` on, as many as the mask is wide."""
    for s in range(lay.b):
        lo, hi = s * lay.blocks, (s + 1) * lay.blocks
        yield lo, lo + 1, 0, "first"
        for a in range(lo + 1, hi - 1, GROUP):
            yield a, min(a + GROUP, hi - 1), -1, "band"
        yield hi - 1, hi, -1, "last"


def _keys(k, v, a: int, z: int, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values of `count` blocks from a + first on, for each query block of [a, z)."""
    return tuple(_spans(x, count)[a + first : z + first] for x in (k, v))


def forward(q, k, v, out: torch.Tensor, lse: torch.Tensor, scaling: float, lay: Layout) -> None:
    """q, k, v: [b * blocks, h, blk, d] views; fills `out` [b * blocks, blk, h, d] and `lse`
    [b * blocks, h, blk]."""
    masks = _masks(lay, q.dtype)
    for a, z, first, name in _calls(lay):
        mask = masks[name][: z - a]
        keys, values = _keys(k, v, a, z, first, mask.shape[-1] // lay.blk)
        o, m = flash(q[a:z], keys, values, attn_mask=mask, scale=scaling)
        out[a:z], lse[a:z] = o.transpose(1, 2), m


def backward(grad, q, k, v, out, lse, scaling: float, lay: Layout) -> tuple[torch.Tensor, ...]:
    """grad and out: [b * blocks, h, blk, d] views, like q, k, v; returns dq, dk, dv in the
    [b * blocks, blk, h, d] layout. Each call's key gradient is added into the blocks it covers."""
    dq = torch.empty(lay.b * lay.blocks, lay.blk, lay.h, lay.d, dtype=q.dtype)  # every block written once
    dk, dv = (torch.zeros(lay.b * lay.blocks, lay.blk, lay.h, lay.d, dtype=q.dtype) for _ in range(2))
    dq4, dk4, dv4 = (t.transpose(1, 2) for t in (dq, dk, dv))
    masks, blk = _masks(lay, q.dtype), lay.blk
    for a, z, first, name in _calls(lay):
        mask = masks[name][: z - a]
        keys, values = _keys(k, v, a, z, first, mask.shape[-1] // blk)
        gq, gk, gv = flash_backward(
            grad[a:z], q[a:z], keys, values, out[a:z], lse[a:z], 0.0, False, attn_mask=mask, scale=scaling
        )  # fmt: skip
        dq4[a:z] = gq
        for t in range(mask.shape[-1] // blk):
            dk4[a + first + t : z + first + t] += gk[:, :, t * blk : (t + 1) * blk]
            dv4[a + first + t : z + first + t] += gv[:, :, t * blk : (t + 1) * blk]
    return dq, dk, dv
