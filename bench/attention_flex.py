"""FlexAttention (`torch.nn.attention.flex_attention`, compiled, with a block mask of the window and
the global token) as the sliding-window kernel: whether it can train on this CPU at all (backward,
log-sum-exp), and its forward time against torch's fused full attention and turbotrain's sliding
kernel, where it runs.

MiniLM's attention shapes (batch 2, 12 heads of 32), window 256, one global token, fp32, no grad
(the only mode FlexAttention has on CPU). One process per length; after a warm-up, the three
kernels alternate within each repeat; the compile is timed apart. The file records each
kernel's largest difference from a dense banded mask.
"""

from __future__ import annotations

import time

import torch
from torch.nn import functional as F

from bench.common import in_fresh_process, interleave, labelled, write

SHAPE = (2, 12, 32)  # batch, heads, head size
WINDOW, GLOBAL = 256, 1


def _allowed(q, k):
    return ((q - k).abs() <= WINDOW) | (q < GLOBAL) | (k < GLOBAL)


def _failure(fn) -> str | None:
    """The one-line error of `fn`, or None when it runs."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 -- recorded as the result, whatever torch raises
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0]}"
    return None


def _ms(fn):
    def timed() -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    return timed


def measure(length: int, repeats: int) -> dict:
    """One length, in its own process: a failed compile can leave dynamo running flex attention
    eagerly (dense, unfused) for the rest of the process, so the probes come after the timing,
    the compiled one (log-sum-exp) first."""
    from torch._inductor import config as inductor
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from turbotrain.models.attention.sliding_window import sliding_window_attention

    b, h, d = SHAPE
    block_mask = create_block_mask(lambda b, h, q, k: _allowed(q, k), None, None, length, length, device="cpu")
    inductor.force_disable_caches = True  # the compile a first run pays, not a cached one
    flex = torch.compile(flex_attention)
    q, k, v = (torch.randn(b, h, length, d) for _ in range(3))
    calls = {
        "flex": lambda: flex(q, k, v, block_mask=block_mask).transpose(1, 2),
        "full (fused)": lambda: F.scaled_dot_product_attention(q, k, v).transpose(1, 2),
        "sliding (ours)": lambda: sliding_window_attention(q, k, v, None, window=WINDOW, block=WINDOW, global_tokens=GLOBAL),
    }
    i = torch.arange(length)
    with torch.no_grad():
        t0 = time.perf_counter()
        calls["flex"]()
        compile_s = time.perf_counter() - t0
        dense = F.scaled_dot_product_attention(q, k, v, attn_mask=_allowed(i[:, None], i[None, :])).transpose(1, 2)
        diff = {n: (calls[n]() - dense).abs().max().item() for n in ("flex", "sliding (ours)")}
        for fn in calls.values():  # warm-up
            fn()
        forward_ms = interleave({name: _ms(fn) for name, fn in calls.items()}, repeats)
    return {
        "compile_s": compile_s,
        "max_abs_diff_vs_dense_band": diff,
        "forward_ms": forward_ms,
        "return_lse": _failure(lambda: flex(q, k, v, block_mask=block_mask, return_lse=True)),
        "backward": _failure(lambda: flex(*(x.clone().requires_grad_() for x in (q, k, v)), block_mask=block_mask)),
    }


def figures(result: dict) -> list[dict]:
    """Per length: FlexAttention's forward against fused full attention's, ours beside it; then
    whether it can train."""
    rows = []
    for r in result["results"].values():
        med = {name: m["median"] for name, m in r["forward_ms"].items()}
        full = med["full (fused)"]
        rows.append(
            {
                "ours": f"{full / med['flex']:.2f}x ({med['flex']:.0f} vs {full:.0f} ms); turbotrain's sliding kernel "
                f"{full / med['sliding (ours)']:.2f}x ({med['sliding (ours)']:.0f} ms); compile {r['compile_s']:.0f} s",
                "ratio": full / med["flex"],
            }
        )
    first = next(iter(result["results"].values()))
    rows.append({"ours": f"backward: {first['backward'] or 'runs'}; log-sum-exp: {first['return_lse'] or 'runs'}"})
    return rows


def run(lengths: tuple[int, ...] = (2048, 4096, 8192), repeats: int = 7) -> str:
    results = {}
    for n in lengths:
        results[str(n)] = in_fresh_process("attention_flex", f"measure({n}, {repeats})")
        print(n, results[str(n)], flush=True)
    result = {"results": results, "window": WINDOW, "global_tokens": GLOBAL, "shape_b_h_d": SHAPE}
    labels = [
        (f"Attention forward @{n} tokens (MiniLM shapes, batch 2, fp32, no grad): FlexAttention, window 256 + global "
         "token block mask, vs fused full", "-")
        for n in lengths
    ]  # fmt: skip
    labels.append(("FlexAttention training on CPU (the sliding window's candidate kernel)", "-"))
    return str(write("attention_flex", {**result, "rows": labelled(labels, figures(result))}))


if __name__ == "__main__":
    print(run())
