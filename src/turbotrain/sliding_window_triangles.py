"""The CPU band kernel's fast case: block = window, every key real (no padding), the length a
multiple of the block. Query block J then sees exactly three key blocks: all of J, the keys of
J + 1 at or before its own position (a causal triangle), and the keys of J - 1 at or after it
(the same triangle with both blocks reversed). Each part is one call of torch's flash kernel with
`is_causal`, which reads no mask, on views of the keys themselves (the reversed part on small
reversed copies, made per call and not kept). At these sizes torch's kernel does not skip a
triangle's empty half (it skips whole 512-key tiles only): a triangle costs a full block.

The parts are merged through their log-sum-exps; the flash backward of each part, given the
merged output and log-sum-exp, is that part's share of the exact gradient. Query blocks go in
groups of GROUP within one sequence, which bounds the transient per call.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from turbotrain.sliding_window_layout import Layout

flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
GROUP = 8  # query blocks per call at most


def fits(keep: torch.Tensor, lay: Layout) -> bool:
    return lay.blk == lay.window and lay.n == lay.n_pad and lay.blocks >= 2 and bool(keep.all())


def _rev(x: torch.Tensor) -> torch.Tensor:
    return x.flip(-2)  # a block's rows in reverse: the previous-block part becomes a causal triangle


def _parts(lay: Layout) -> Iterator[tuple[int, int, int, int, int]]:
    """Per group of query blocks [a, z) of one sequence: (a, z, c, p) where the next-block part
    covers queries [a, c) and the previous-block part queries [p, z)."""
    for s in range(lay.b):
        lo, hi = s * lay.blocks, (s + 1) * lay.blocks
        for a in range(lo, hi, GROUP):
            z = min(a + GROUP, hi)
            yield a, z, min(z, hi - 1), max(a, lo + 1)


def forward(q, k, v, out: torch.Tensor, lse: torch.Tensor, scaling: float, lay: Layout) -> None:
    """q, k, v: [b * blocks, h, blk, d] views; fills `out` [b * blocks, blk, h, d] and `lse`
    [b * blocks, h, blk]."""
    for a, z, c, p in _parts(lay):
        o_own, l_own = flash(q[a:z], k[a:z], v[a:z], scale=scaling)
        pieces = [(a, z, o_own, l_own)]
        if c > a:
            o_next, l_next = flash(q[a:c], k[a + 1 : c + 1], v[a + 1 : c + 1], is_causal=True, scale=scaling)
            pieces.append((a, c, o_next, l_next))
        if p < z:
            o_prev, l_prev = flash(_rev(q[p:z]), _rev(k[p - 1 : z - 1]), _rev(v[p - 1 : z - 1]), is_causal=True, scale=scaling)
            pieces.append((p, z, _rev(o_prev), l_prev.flip(-1)))
        merged = l_own.clone()
        for i, j, _, part in pieces[1:]:
            merged[i - a : j - a] = torch.logaddexp(merged[i - a : j - a], part)
        total = o_own.to(merged.dtype) * torch.exp(l_own - merged)[..., None]  # the kernel's accumulation type
        for i, j, o, part in pieces[1:]:
            total[i - a : j - a] += o.to(merged.dtype) * torch.exp(part - merged[i - a : j - a])[..., None]
        out[a:z], lse[a:z] = total.transpose(1, 2), merged


def backward(grad, q, k, v, out, lse, scaling: float, lay: Layout) -> tuple[torch.Tensor, ...]:
    """grad and out: [b * blocks, h, blk, d] views, like q, k, v; returns dq, dk, dv in the
    [b * blocks, blk, h, d] layout."""
    # a group's own part writes its query blocks' dq first; its next-block part reaches the next
    # group's first key block, which that group's own part has not written yet
    dq = torch.empty(lay.b * lay.blocks, lay.blk, lay.h, lay.d, dtype=q.dtype)
    dk, dv = (torch.zeros_like(dq) for _ in range(2))
    dq4, dk4, dv4 = (t.transpose(1, 2) for t in (dq, dk, dv))
    for a, z, c, p in _parts(lay):
        gq, gk, gv = flash_backward(grad[a:z], q[a:z], k[a:z], v[a:z], out[a:z], lse[a:z], 0.0, False, scale=scaling)
        dq4[a:z] = gq
        dk4[a:z] += gk
        dv4[a:z] += gv
        if c > a:
            keys = slice(a + 1, c + 1)
            gq, gk, gv = flash_backward(
                grad[a:c], q[a:c], k[keys], v[keys], out[a:c], lse[a:c], 0.0, True, scale=scaling
            )  # fmt: skip
            dq4[a:c] += gq
            dk4[keys] += gk
            dv4[keys] += gv
        if p < z:
            keys = slice(p - 1, z - 1)
            gq, gk, gv = flash_backward(
                _rev(grad[p:z]), _rev(q[p:z]), _rev(k[keys]), _rev(v[keys]), _rev(out[p:z]), lse[p:z].flip(-1), 0.0, True,
                scale=scaling,
            )  # fmt: skip
            dq4[p:z] += _rev(gq)
            dk4[keys] += _rev(gk)
            dv4[keys] += _rev(gv)
    return dq, dk, dv
