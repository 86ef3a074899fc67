"""The sliding-window kernel against the dense banded mask and the kernel it replaced: outputs
and gradients, every padding layout, both code paths, and what it keeps for backward."""

from __future__ import annotations

import pytest
import torch
from attention_reference import copying_kernel, naive_banded
from torch.nn import functional as F

from turbotrain.models.attention.sliding_window import sliding_window_attention

TOL = {"rtol": 1e-4, "atol": 1e-5}


def _qkv(b=2, h=2, n=37, d=8, seed=0, dtype=torch.float32):
    """Queries, keys and values laid out as a transformer's projections make them ([b, n, h, d]
    memory seen as [b, h, n, d]); the second sequence is right-padded."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, n, h, d, generator=g, dtype=dtype).transpose(1, 2).requires_grad_() for _ in range(3))
    keep = torch.ones(b, n, dtype=torch.bool)
    keep[1, 29 * n // 37 :] = False
    return q, k, v, keep


@pytest.mark.parametrize(("window", "block", "global_tokens"), [(4, 2, 0), (5, 3, 1), (3, 8, 2), (7, 7, 0)])
def test_kernel_equals_naive_banded_reference(window, block, global_tokens):
    q, k, v, keep = _qkv()
    out = sliding_window_attention(q, k, v, keep, window=window, block=block, global_tokens=global_tokens)
    ref = naive_banded(q, k, v, keep, window, global_tokens)
    torch.testing.assert_close(out[0], ref[0], **TOL)
    torch.testing.assert_close(out[1, :29], ref[1, :29], **TOL)  # padded queries' outputs are unused
    full = naive_banded(q, k, v, keep, window=10**6)
    assert (out[0] - full[0]).abs().max() > 1e-3  # a narrow window really differs from full attention


def _padding(keep: torch.Tensor, where: str) -> torch.Tensor | None:
    n = keep.shape[1]
    keep = torch.ones_like(keep)
    if where == "none":
        return None
    if where == "right":
        keep[-1, n - n // 3 :] = False
    elif where == "left":
        keep[0, :3] = False
    else:  # a hole: no block of that sequence has the shared band mask
        keep[0, n // 2] = False
    return keep


def _outputs_and_grads(fn, q, k, v, keep):
    out = fn(q, k, v, keep)
    real = torch.ones(out.shape[:2], dtype=torch.bool) if keep is None else keep
    real = real[:, :, None, None]
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype) * real
    return out * real, torch.autograd.grad((out * weights).sum(), (q, k, v))


# (n, window, block, global tokens): blocks that divide n or not, block below, at and above the
# window, several global tokens, a window covering the sequence (full attention); block = window
# dividing n without padding takes the causal-triangle path (several groups of blocks; two blocks)
SHAPES = [
    (100, 10, 10, 1),  # block = window, 10 blocks: the first, one full group of 8, the last
    (90, 10, 10, 1),  # 9 blocks: a group shorter than GROUP
    (120, 10, 10, 1),  # 12 blocks: a full group and a short one
    (100, 10, 5, 2),
    (97, 7, 3, 0),
    (64, 8, 16, 1),
    (50, 3, 7, 3),
    (40, 39, 8, 1),
    (96, 8, 8, 0),
    (16, 8, 8, 2),  # 2 blocks: a first and a last, no group
]


@pytest.mark.parametrize("padding", ["none", "right", "left", "hole"])
@pytest.mark.parametrize(("n", "window", "block", "global_tokens"), SHAPES)
def test_outputs_and_gradients_equal_the_dense_banded_mask(n, window, block, global_tokens, padding):
    q, k, v, keep = _qkv(b=2, h=3, n=n, d=8, dtype=torch.float64)
    keep = _padding(keep, padding)
    dense_keep = torch.ones(2, n, dtype=torch.bool) if keep is None else keep
    ours = _outputs_and_grads(
        lambda *a: sliding_window_attention(*a, window=window, block=block, global_tokens=global_tokens), q, k, v, keep
    )
    ref = _outputs_and_grads(lambda q, k, v, _: naive_banded(q, k, v, dense_keep, window, global_tokens), q, k, v, keep)
    torch.testing.assert_close(ours, ref, rtol=1e-9, atol=1e-11)


def test_equals_the_kernel_it_replaced_in_float32():
    q, k, v, keep = _qkv(b=2, h=4, n=300, d=16)
    args = {"window": 32, "block": 32, "global_tokens": 1}
    ours = _outputs_and_grads(lambda *a: sliding_window_attention(*a, **args), q, k, v, keep)
    old = _outputs_and_grads(lambda *a: copying_kernel(*a, **args), q, k, v, keep)
    torch.testing.assert_close(ours, old, **TOL)


def test_the_dropout_path_equals_the_reference():
    """Attention dropout takes torch's public attention (the path CUDA takes too); a rate too
    small to drop anything runs it exactly."""
    q, k, v, keep = _qkv(b=2, h=2, n=90, d=8, dtype=torch.float64)
    args = {"window": 10, "block": 10, "global_tokens": 1, "dropout": 1e-12, "training": True}
    ours = _outputs_and_grads(lambda *a: sliding_window_attention(*a, **args), q, k, v, keep)
    ref = _outputs_and_grads(lambda q, k, v, keep: naive_banded(q, k, v, keep, 10, 1), q, k, v, keep)
    torch.testing.assert_close(ours, ref, rtol=1e-7, atol=1e-9)


def test_bf16_stays_close_to_float32():
    q, k, v, keep = _qkv(b=2, h=2, n=200, d=16)
    args = {"window": 16, "block": 16, "global_tokens": 1}
    ref = sliding_window_attention(q, k, v, keep, **args)
    low = sliding_window_attention(*(t.detach().bfloat16() for t in (q, k, v)), keep, **args)
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float()[keep], ref.detach()[keep], rtol=0.05, atol=0.05)


def test_padding_is_never_attended():
    q, k, v, keep = _qkv()
    q, k, v = (t.detach() for t in (q, k, v))
    out = sliding_window_attention(q, k, v, keep, window=6, block=4, global_tokens=1)
    k2, v2 = k.clone(), v.clone()
    k2[1, :, 29:] = 1e3 * torch.randn_like(k2[1, :, 29:])
    v2[1, :, 29:] = 1e3
    out2 = sliding_window_attention(q, k2, v2, keep, window=6, block=4, global_tokens=1)
    torch.testing.assert_close(out2[1, :29], out[1, :29], rtol=0, atol=0)


def _saved_bytes(fn, q, k, v, keep) -> int:
    """Bytes of the distinct storages the autograd graph keeps for backward."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(q, k, v, keep)
    return sum(storages.values())


def test_keeps_no_more_for_backward_than_fused_full_attention():
    """Fused full attention keeps queries, keys, values, output and log-sum-exp: O(n). So does the
    kernel (plus the 2-D padding mask), with no key/value copy and no mask; the kernel it replaced
    kept each block's key span (3x the keys) and an n x span mask."""
    q, k, v, keep = _qkv(b=2, h=4, n=1024, d=16)
    keep = None
    args = {"window": 64, "block": 64, "global_tokens": 1}
    full = _saved_bytes(lambda q, k, v, _: F.scaled_dot_product_attention(q, k, v), q, k, v, keep)
    ours = _saved_bytes(lambda *a: sliding_window_attention(*a, **args), q, k, v, keep)
    old = _saved_bytes(lambda *a: copying_kernel(*a, **args), q, k, v, keep)
    assert ours <= full * 1.01
    assert old > 2 * full
