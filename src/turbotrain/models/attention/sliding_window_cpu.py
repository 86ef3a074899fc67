"""The sliding-window kernel's CPU path (no attention dropout): torch's fused flash kernel over
strided views of the keys themselves, in one autograd function that keeps for backward exactly
what fused full attention keeps (queries, keys, values, output, log-sum-exp) and no mask.

- The band: query block J sees key rows (J - r) * block .. (J + r + 1) * block of the batch's keys
  flattened to [b * n, h, d]; that is one strided view (a projection's output is already laid
  out so), blocks whose window crosses into the next sequence mask those keys. Only the r blocks
  at each end of the batch read a small zero-padded copy. No key/value copy is made when the
  length is a multiple of the block.
- Blocks whose band keys are all real (most of them) share one broadcast mask; the blocks at a
  sequence's ends or next to padding get their own, rebuilt in backward.
- The global keys each query sees outside its window are merged into the band's softmax through
  the log-sum-exp; the flash backward with the merged output and log-sum-exp then gives the band
  part of the gradient exactly, and the global part is a few small matmuls.
- The global queries' rows are full-row attention, written over the band's rows.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from turbotrain.models.attention import sliding_window_triangles as triangles
from turbotrain.models.attention.sliding_window_layout import Layout, additive, band_mask, regular_runs

flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def _flat(x: torch.Tensor, lay: Layout) -> torch.Tensor:
    """[b, h, n, d] -> [b * n_pad, h, d]: a view of a projection's [b, n, h * d] output."""
    x = x.transpose(1, 2)
    if lay.n_pad > lay.n:
        x = F.pad(x, (0, 0, 0, 0, 0, lay.n_pad - lay.n))
    return x.reshape(-1, lay.h, lay.d)


def _bounds(lay: Layout) -> list[tuple[int, int, int]]:
    """(first block, stop block, the flat key row at the buffer's row 0) per key buffer: the
    middle blocks view the keys themselves; the r blocks at each end, whose windows reach past
    the batch, a zero-padded copy of the rows they need."""
    e, blocks = lay.r * lay.blk, lay.b * lay.blocks
    if blocks <= 2 * lay.r:
        return [(0, blocks, -e)]
    return [(0, lay.r, -e), (lay.r, blocks - lay.r, 0), (blocks - lay.r, blocks, (blocks - 2 * lay.r) * lay.blk)]


def _pieces(flat: torch.Tensor, lay: Layout) -> list[torch.Tensor]:
    """The key buffers of `_bounds`, in its order."""
    e = lay.r * lay.blk
    if len(_bounds(lay)) == 1:
        return [F.pad(flat, (0, 0, 0, 0, e, e))]
    return [F.pad(flat[: 2 * e], (0, 0, 0, 0, e, 0)), flat, F.pad(flat[len(flat) - 2 * e :], (0, 0, 0, 0, 0, e))]


CALL_BLOCKS = 4  # blocks per kernel call at most: its key gradients are 3x its keys, a transient


def _plan(keep: torch.Tensor, lay: Layout, dtype: torch.dtype) -> list[tuple[int, int, torch.Tensor, int, int]]:
    """Per run of query blocks [a, z) within one key buffer: (a, z, float mask, buffer index,
    the buffer's window index of block a)."""
    e, plan = lay.r * lay.blk, []
    for a, z, regular in regular_runs(keep, lay):
        for p, (lo, hi, start) in enumerate(_bounds(lay)):
            for a2 in range(max(a, lo), min(z, hi), CALL_BLOCKS):
                z2 = min(a2 + CALL_BLOCKS, z, hi)
                allowed = band_mask(keep, lay, torch.arange(a2, a2 + 1 if regular else z2, device=keep.device))
                plan.append((a2, z2, additive(allowed, dtype).expand(z2 - a2, -1, -1, -1), p, a2 - (start + e) // lay.blk))
    return plan


def _windows(buffer: torch.Tensor, lay: Layout) -> torch.Tensor:
    return buffer.unfold(0, lay.span, lay.blk).permute(0, 1, 3, 2)  # [windows, h, span, d]


def _acc(x: torch.Tensor) -> torch.dtype:
    """fp32 for bf16/fp16 inputs (as the flash kernel accumulates), else the input's."""
    return torch.promote_types(x.dtype, torch.float32)


def _padded(query: torch.Tensor, lay: Layout) -> torch.Tensor:
    return F.pad(query, (0, 0, 0, lay.n_pad - lay.n)) if lay.n_pad > lay.n else query


def _bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for [b, h, m, k] x [b, h, k, p], one bmm per sequence: q, k, v and their gradients are
    [b, n, h, d] underneath, which torch.matmul would copy whole to fold b and h together."""
    out = a.new_empty(*a.shape[:-1], b.shape[-1])
    for x, y, o in zip(a, b, out, strict=True):
        torch.bmm(x, y, out=o)
    return out


def _global_scores(q4, key, keep, lay: Layout, g: int, scaling: float) -> torch.Tensor:
    """[b, h, n_pad, g] fp32 scores of every query against the global keys outside its window."""
    acc = _acc(key)
    s = _bmm(q4.to(acc), key[:, :, :g].to(acc).transpose(-1, -2)) * scaling
    q_pos = torch.arange(lay.n_pad, device=keep.device)[:, None]
    outside = (q_pos - torch.arange(g, device=keep.device)) > lay.window
    return s.masked_fill(~(outside & keep[:, None, None, :g]), float("-inf"))


def _global_rows(query, key, keep, g: int, scaling: float) -> torch.Tensor:
    """[b, h, g, n] fp32 probabilities of the global queries over every real key, and the global
    keys always (no empty row). Plain products: for g rows the flash kernel would zero-fill and
    copy key gradients at the keys' full size."""
    acc = _acc(key)
    s = _bmm(query[:, :, :g].to(acc), key.to(acc).transpose(-1, -2)) * scaling
    seen = keep | (torch.arange(keep.shape[1], device=keep.device) < g)
    return torch.softmax(s.masked_fill(~seen[:, None, None, :], float("-inf")), -1)


def _add_outer(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """out += a @ b where the inner size is the few global tokens: one multiply-add per token in
    `out`'s own layout, in place (a product would allocate and fill a new tensor of out's size)."""
    for j in range(a.shape[-1]):
        out.addcmul_(a[..., j : j + 1], b[..., j : j + 1, :])


def _score_grad(p, d_out, out, v, scaling: float) -> torch.Tensor:
    """The scores' gradient through probabilities `p` of queries over keys with values v, where
    `out` and `d_out` are the queries' whole output and its gradient (p may cover part of their keys)."""
    delta = (d_out * out).sum(-1, keepdim=True)
    return p * (_bmm(d_out, v.transpose(-1, -2)) - delta) * scaling


def _rows(lse: torch.Tensor, lay: Layout) -> torch.Tensor:
    """Block layout [b * blocks, h, blk] -> [b, h, n_pad]."""
    return lse.view(lay.b, lay.blocks, lay.h, lay.blk).transpose(1, 2).reshape(lay.b, lay.h, lay.n_pad)


def _blocks(lse: torch.Tensor, lay: Layout) -> torch.Tensor:
    """[b, h, n_pad] -> block layout [b * blocks, h, blk]."""
    return lse.view(lay.b, lay.h, lay.blocks, lay.blk).transpose(1, 2).reshape(-1, lay.h, lay.blk)


def _blocked(x: torch.Tensor, lay: Layout) -> torch.Tensor:
    """[b, h, n, d] -> [b * blocks, h, blk, d]: each block's rows, a view."""
    return _flat(x, lay).view(-1, lay.blk, lay.h, lay.d).transpose(1, 2)


def _bands(q, key, value, keep, out, lse, lay: Layout, scaling: float) -> None:
    """The band's output and log-sum-exp of every query block, into `out` and `lse`."""
    if triangles.fits(keep, lay):
        triangles.forward(q, _blocked(key, lay), _blocked(value, lay), out, lse, scaling, lay)
        return
    kp, vp = _pieces(_flat(key, lay), lay), _pieces(_flat(value, lay), lay)
    for a, z, mask, p, i in _plan(keep, lay, q.dtype):
        kw, vw = _windows(kp[p], lay)[i : i + z - a], _windows(vp[p], lay)[i : i + z - a]
        o, m = flash(q[a:z], kw, vw, attn_mask=mask, scale=scaling)
        out[a:z], lse[a:z] = o.transpose(1, 2), m


def _bands_backward(grad, q, key, value, keep, out, lse, lay: Layout, scaling: float):
    """The band's dq, dk, dv in the [b * blocks, blk, h, d] layout; grad and out in that layout too."""
    grad_blocks, out_blocks = grad.transpose(1, 2), out.transpose(1, 2)
    if triangles.fits(keep, lay):
        return triangles.backward(grad_blocks, q, _blocked(key, lay), _blocked(value, lay), out_blocks, lse, scaling, lay)
    kp, vp = _pieces(_flat(key, lay), lay), _pieces(_flat(value, lay), lay)
    dq = torch.empty_like(out)  # every block is written
    dk, dv = (torch.zeros(lay.b * lay.n_pad, lay.h, lay.d, dtype=q.dtype, device=q.device) for _ in range(2))
    for a, z, mask, p, i in _plan(keep, lay, q.dtype):
        kw, vw = _windows(kp[p], lay)[i : i + z - a], _windows(vp[p], lay)[i : i + z - a]
        gq, gk, gv = flash_backward(
            grad_blocks[a:z], q[a:z], kw, vw, out_blocks[a:z], lse[a:z], 0.0, False, attn_mask=mask, scale=scaling
        )  # fmt: skip
        dq[a:z] = gq.transpose(1, 2)
        start = _bounds(lay)[p][2] + i * lay.blk  # flat row of the first window's first key
        _fold(dk, gk, start, z - a, lay)
        _fold(dv, gv, start, z - a, lay)
    return dq, dk, dv


class FlashBands(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, keep, lay: Layout, g: int, scaling: float):
        out = query.new_empty(lay.b * lay.blocks, lay.blk, lay.h, lay.d)  # [b, n, h, d] order, as SDPA's output
        lse = torch.empty(lay.b * lay.blocks, lay.h, lay.blk, dtype=_acc(query), device=query.device)
        _bands(_blocked(query, lay), key, value, keep, out, lse, lay, scaling)
        out = out.view(lay.b, lay.n_pad, lay.h, lay.d)
        if g:
            lse = _merge_globals(out, lse, query, key, value, keep, lay, g, scaling)
            out[:, :g] = _bmm(_global_rows(query, key, keep, g, scaling), value.to(lse.dtype)).transpose(1, 2)
        ctx.save_for_backward(query, key, value, keep, out, lse)
        ctx.lay, ctx.g, ctx.scaling = lay, g, scaling
        return out

    @staticmethod
    def backward(ctx, grad):
        query, key, value, keep, out, lse = ctx.saved_tensors
        lay, g, scaling = ctx.lay, ctx.g, ctx.scaling
        band_grad = grad
        if g:  # the global queries' rows are not the band's
            band_grad = grad.clone()
            band_grad[:, :g] = 0
        grad_blocks, out_blocks = band_grad.reshape(-1, lay.blk, lay.h, lay.d), out.view(-1, lay.blk, lay.h, lay.d)
        grads = _bands_backward(grad_blocks, _blocked(query, lay), key, value, keep, out_blocks, lse, lay, scaling)
        dq4, dk4, dv4 = (t.view(lay.b, lay.n_pad, lay.h, lay.d) for t in grads)
        if g:
            _globals_backward(band_grad, grad, out, lse, query, key, value, keep, lay, g, scaling, (dq4, dk4, dv4))
        return (*(t[:, : lay.n].transpose(1, 2) for t in (dq4, dk4, dv4)), None, None, None, None)


def _fold(flat_grad: torch.Tensor, window_grad: torch.Tensor, start: int, count: int, lay: Layout) -> None:
    """Add the gradient of `count` overlapping windows, the first at flat row `start`, into
    `flat_grad`, dropping the rows outside the batch (the padded copies' zeros)."""
    length = (count - 1) * lay.blk + lay.span
    folded = torch.ops.aten.unfold_backward(window_grad.permute(0, 1, 3, 2), [length, lay.h, lay.d], 0, lay.span, lay.blk)
    lo, hi = max(start, 0), min(start + length, len(flat_grad))
    flat_grad[lo:hi] += folded[lo - start : hi - start]


def _merge_globals(out, lse, query, key, value, keep, lay: Layout, g: int, scaling: float) -> torch.Tensor:
    """Fold the global keys outside each query's window into `out` (in place); returns the merged
    log-sum-exp in block layout."""
    s = _global_scores(_padded(query, lay), key, keep, lay, g, scaling)
    band_lse = _rows(lse, lay)
    total = torch.logaddexp(band_lse, torch.logsumexp(s, -1))
    view = out.transpose(1, 2)  # [b, h, n_pad, d]
    view.mul_(torch.exp(band_lse - total)[..., None])
    _add_outer(view, torch.exp(s - total[..., None]), value[:, :, :g])
    return _blocks(total, lay)


def _globals_backward(band_grad, grad, out, lse, query, key, value, keep, lay, g, scaling, grads) -> None:
    """The global keys' part of the band queries' gradient (softmax backward over the merged
    probabilities), then the global queries' full rows."""
    dq4, dk4, dv4 = grads
    acc = lse.dtype
    q4, k4, v4 = (x.to(acc) for x in (_padded(query, lay), key, value))
    p = torch.exp(_global_scores(q4, key, keep, lay, g, scaling) - _rows(lse, lay)[..., None])  # [b, h, n_pad, g]
    o4, d4 = out.transpose(1, 2).to(acc), band_grad.transpose(1, 2).to(acc)
    ds = _score_grad(p, d4, o4, v4[:, :, :g], scaling)
    _add_outer(dq4.transpose(1, 2), ds, k4[:, :, :g])
    dk4[:, :g].add_(_bmm(ds.transpose(-1, -2), q4).transpose(1, 2))
    dv4[:, :g].add_(_bmm(p.transpose(-1, -2), d4).transpose(1, 2))
    p, d_g = _global_rows(query, key, keep, g, scaling), grad[:, :g].transpose(1, 2).to(acc)
    ds = _score_grad(p, d_g, o4[:, :, :g], v4, scaling)
    dq4[:, :g].add_(_bmm(ds, k4).transpose(1, 2))
    _add_outer(dk4[:, : lay.n].transpose(1, 2), ds.transpose(-1, -2), q4[:, :, :g])
    _add_outer(dv4[:, : lay.n].transpose(1, 2), p.transpose(-1, -2), d_g)
