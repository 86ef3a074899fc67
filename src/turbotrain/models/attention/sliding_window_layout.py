"""The sliding-window kernel's block layout and masks, shared by its two paths.

Queries go in blocks of `block` tokens; block J sees the key chunks J - r .. J + r,
r = ceil(window / block). A chunk is a block's keys, after a copy of its sequence's global keys
where a path sees those through the band (`g` > 0); the CPU path merges them separately (g = 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F


@dataclass(frozen=True)
class Layout:
    """Sizes of the blocked layout, and the views into the flat keys."""

    b: int
    n: int
    h: int
    d: int
    window: int
    blk: int
    g: int  # global tokens

    @property
    def blocks(self) -> int:  # per sequence
        return -(-self.n // self.blk)

    @property
    def n_pad(self) -> int:
        return self.blocks * self.blk

    @property
    def r(self) -> int:  # neighbouring blocks each side that the window reaches
        return -(-self.window // self.blk)

    @property
    def chunk(self) -> int:
        return self.g + self.blk

    @property
    def span(self) -> int:
        return (2 * self.r + 1) * self.chunk

    def flat(self, x: torch.Tensor) -> torch.Tensor:
        """[b, h, n, d] -> [(2r + b * blocks) * chunk, h, d]: r empty chunks, then each block
        after a copy of its sequence's global tokens, then r empty chunks. The one copy made."""
        b, blocks, blk, h, d, g = self.b, self.blocks, self.blk, self.h, self.d, self.g
        x = F.pad(x.transpose(1, 2), (0, 0, 0, 0, 0, self.n_pad - self.n)).reshape(b, blocks, blk, h, d)
        if g:
            x = torch.cat([x[:, :1, :g].expand(b, blocks, g, h, d), x], dim=2)
        return F.pad(x.reshape(b * blocks * self.chunk, h, d), (0, 0, 0, 0, self.r * self.chunk, self.r * self.chunk))

    def bands(self, flat: torch.Tensor) -> torch.Tensor:
        """Block J's keys: [b * blocks, h, span, d], a strided view of `flat`."""
        return flat.unfold(0, self.span, self.chunk).permute(0, 1, 3, 2)

    def whole(self, flat: torch.Tensor) -> torch.Tensor:
        """Each sequence's keys, globals' copies included: [b, h, blocks * chunk, d], a view."""
        c = self.r * self.chunk
        return flat[c : c + self.b * self.blocks * self.chunk].view(self.b, -1, self.h, self.d).transpose(1, 2)

    def queries(self, qp: torch.Tensor) -> torch.Tensor:
        """[b, n_pad, h, d] -> [b * blocks, h, blk, d]."""
        return qp.reshape(self.b * self.blocks, self.blk, self.h, self.d).transpose(1, 2)


def band_mask(keep: torch.Tensor, lay: Layout, blocks: torch.Tensor | None = None) -> torch.Tensor:
    """[len(blocks), 1, blk, span] bool (default: all b * blocks): which of its view's keys each
    query of block J may see. The band pattern (|query - key| <= window, and the own chunk's
    global keys) is the same for every block; a key must also be real (not padding, not past
    either end, not a global token, which is seen through the copies). A query always sees
    itself, so no row is empty."""
    n, g, blk, dev = lay.n, lay.g, lay.blk, keep.device
    blocks = torch.arange(lay.b * lay.blocks, device=dev) if blocks is None else blocks
    s = torch.arange(lay.span, device=dev)
    rel, slot = s // lay.chunk - lay.r, s % lay.chunk  # chunk offset from the query's block, slot in the chunk
    is_global = slot < g
    dist = torch.arange(blk, device=dev)[:, None] - (rel * blk + slot - g)  # [blk, span]
    pattern = ((dist.abs() <= lay.window) & ~is_global) | (is_global & (rel == 0))
    seq, first = blocks // lay.blocks, (blocks % lay.blocks) * blk
    k_pos = torch.where(is_global, slot, first[:, None] + rel * blk + slot - g)  # [len(blocks), span]
    real = (is_global | (k_pos >= g)) & (k_pos < n) & keep[seq[:, None], k_pos.clamp(0, n - 1)]
    allowed = (pattern & real[:, None, :]) | ((dist == 0) & ~is_global)
    return allowed[:, None]


def global_mask(keep: torch.Tensor, lay: Layout) -> torch.Tensor:
    """[b, 1, 1, blocks * chunk] bool for the global queries over `Layout.whole`: every real key
    once, the global keys through block 0's copies (always seen, so no row is empty)."""
    s = torch.arange(lay.blocks * lay.chunk, device=keep.device)
    block, slot = s // lay.chunk, s % lay.chunk
    pos = block * lay.blk + slot - lay.g
    real = (slot >= lay.g) & (pos >= lay.g) & (pos < lay.n) & keep[:, pos.clamp(0, lay.n - 1)]
    return (real | ((slot < lay.g) & (block == 0)))[:, None, None, :]


def regular_runs(keep: torch.Tensor, lay: Layout) -> list[tuple[int, int, bool]]:
    """Runs [start, stop) of the b * blocks query blocks, each regular or not. A block is regular
    when every key in its band is real: its mask is then the one band pattern all such blocks
    share. Sequences padded other than on the right have no regular blocks."""
    lengths = keep.sum(1)
    right_padded = (keep == (torch.arange(lay.n, device=keep.device) < lengths[:, None])).all(1)
    lo = -(-(lay.g + lay.window) // lay.blk)  # first block whose band starts after the global tokens
    runs: list[tuple[int, int, bool]] = []
    for i, (length, ok) in enumerate(zip(lengths.tolist(), right_padded.tolist(), strict=True)):
        hi = (length - lay.window) // lay.blk if ok and length >= lay.g else 0  # past the last whose band ends in the sequence
        parts = [(0, lo, False), (lo, hi, True), (hi, lay.blocks, False)] if hi > lo else [(0, lay.blocks, False)]
        for a, z, regular in ((i * lay.blocks + a, i * lay.blocks + z, regular) for a, z, regular in parts if z > a):
            if runs and not regular and not runs[-1][2] and runs[-1][1] == a:
                runs[-1] = (runs[-1][0], z, False)
            else:
                runs.append((a, z, regular))
    return runs


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The flash kernel takes float masks only."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))
