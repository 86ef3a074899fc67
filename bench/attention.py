"""Fused full vs sliding-window attention on MiniLM-L6 training steps: step time and memory at
2048, 4096 and 8192 tokens, fp32 and bf16 autocast, attention dropout 0 both ways; plus what
attention dropout costs the window, and the long-input memory claim (2048-token sliding window
with checkpointing against 512-token full attention as BERT ships it, dropout 0.1).

Each measurement runs in its own process (the CPU peak-RSS high-water mark only grows), with
configurations interleaved across repeats. Random token ids (speed and memory only); the model is
MiniLM-L6's architecture (pretrained weights do not change speed). Batch 2.
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from pathlib import Path

from bench.common import cpu_isa, in_fresh_process, labelled, write

FULL = {"name": "full", "dropout": 0.0}
SLIDING = {"name": "sliding_window", "window": 256}  # its default dropout, 0
# (length, dtype) -> name -> attention overrides; dtype None: fp32. bf16 at every length only on
# CPUs with bf16 instructions: without them (AVX2 only) autocast emulates bf16, several times
# slower than fp32, and 8192 tokens would take hours.
NATIVE_BF16 = bool({"avx512_bf16", "amx_bf16"} & set(cpu_isa()))
SPEED = {
    (length, dtype): {"full (fused)": FULL, "sliding w=256": SLIDING}
    for dtype in (None, "bfloat16")
    for length in ((2048, 4096, 8192) if dtype is None or NATIVE_BF16 else (2048,))
}
EXTRA = {
    (2048, None): {"sliding w=256, attention dropout 0.1": {**SLIDING, "dropout": 0.1}},
    (512, None): {"full, attention dropout 0.1 (as BERT ships)": {"name": "full"}},
}
LONG = (2048, None, "sliding w=256 + checkpointing", {**SLIDING, "checkpointing": True})


def measure(attention: dict, length: int, dtype: str | None, steps: int = 2) -> dict:
    """One process: build, warm up, time `steps` training steps; peak RSS growth over the steps."""
    import torch
    from omegaconf import OmegaConf

    import turbotrain.options  # noqa: F401  (fills the option registries)
    from turbotrain.core.allocator import configure_malloc
    from turbotrain.models.attention.options import ATTENTION, apply_attention
    from turbotrain.models.text import TextModelConfig, build_text_model

    configure_malloc("retain")  # as a training process has it (trainer.malloc's default)
    torch.manual_seed(0)
    model = build_text_model(OmegaConf.structured(TextModelConfig(name="minilm")), 6, length, vocab_size=30522)
    apply_attention(model, OmegaConf.merge(OmegaConf.structured(ATTENTION[attention["name"]].schema), attention))  # its defaults
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)  # as turbotrain.train.optim builds it
    ids = torch.randint(1000, 30000, (2, length))
    mask = torch.ones_like(ids)
    y = torch.tensor([0, 1])

    def step():
        with torch.autocast("cpu", dtype=getattr(torch, dtype or "bfloat16"), enabled=dtype is not None):
            logits = model(input_ids=ids, attention_mask=mask).logits
        torch.nn.functional.cross_entropy(logits.float(), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    page_mb = os.sysconf("SC_PAGE_SIZE") / 2**20
    model_mb = int(Path("/proc/self/statm").read_text().split()[1]) * page_mb  # resident now: weights, inputs
    step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "step_s": (time.perf_counter() - t0) / steps,
        "peak_rss_mb": peak,
        "train_mem_mb": peak - model_mb,  # activations, gradients, optimizer state at the peak
    }


def _key(length: int, dtype: str | None) -> str:
    return f"{length} {dtype or 'fp32'}"


def _median(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def figures(result: dict) -> list[dict]:
    """Per length and dtype: sliding window against fused full attention; then dropout's cost and
    the long-input memory claim. Medians over repeats."""
    res = {key: {name: _median(runs) for name, runs in by_name.items()} for key, by_name in result["results"].items()}
    rows = []
    for length, dtype in result["speed"]:
        m = res[_key(length, dtype)]
        full, sw = m["full (fused)"], m["sliding w=256"]
        rows.append(
            {
                "ours": f"{full['step_s'] / sw['step_s']:.2f}x ({sw['step_s']:.1f} vs {full['step_s']:.1f} s/step); training "
                f"memory above the model {sw['train_mem_mb']:.0f} vs {full['train_mem_mb']:.0f} MB "
                f"({sw['train_mem_mb'] / full['train_mem_mb']:.2f}x)",
                "ratio": full["step_s"] / sw["step_s"],
            }
        )
    m = res[_key(2048, None)]
    sw, dropped = m["sliding w=256"], m["sliding w=256, attention dropout 0.1"]
    rows.append(
        {
            "ours": f"{dropped['step_s'] / sw['step_s']:.2f}x faster ({sw['step_s']:.1f} vs {dropped['step_s']:.1f} s/step)",
            "ratio": dropped["step_s"] / sw["step_s"],
        }
    )
    long, short = m[LONG[2]], res[_key(512, None)]["full, attention dropout 0.1 (as BERT ships)"]
    ratio = long["peak_rss_mb"] / short["peak_rss_mb"]
    rows.append({"ours": f"peak RSS {long['peak_rss_mb']:.0f} vs {short['peak_rss_mb']:.0f} MB ({ratio:.2f}x)"})
    return rows


def _labels(speed) -> list[tuple[str, str]]:
    speed = [
        (
            f"MiniLM training step @{length} tokens, batch 2, {dtype or 'fp32'}: sliding w=256 vs fused full (dropout 0 both)",
            "512 -> 2048 tokens, 2.1x faster" if (length, dtype) == (2048, None) else "-",
        )
        for length, dtype in speed
    ]
    return [
        *speed,
        ("MiniLM @2048 tokens, sliding w=256: attention dropout 0 (the default) vs 0.1", "-"),
        ("MiniLM training @2048 tokens, sliding w=256 + checkpointing vs 512 tokens full attention (dropout 0.1)", "-"),
    ]


def run(repeats: int = 2, bf16_repeats: int = 1) -> str:
    """fp32 measurements `repeats` times, interleaved; bf16 (emulated on most CPUs, slow) fewer
    times. One timed step (after the warm-up one) where a step takes a minute or more."""
    plan = [(*key, name, att) for key, by_name in (*SPEED.items(), *EXTRA.items()) for name, att in by_name.items()]
    results: dict = {}
    for repeat in range(repeats):
        for length, dtype, name, attention in [*plan, LONG]:
            if dtype and repeat >= bf16_repeats:
                continue
            call = f"measure({attention!r}, {length}, {dtype!r}, steps={1 if dtype or length > 4096 else 2})"
            results.setdefault(_key(length, dtype), {}).setdefault(name, []).append(in_fresh_process("attention", call))
            print(length, dtype, name, results[_key(length, dtype)][name][-1], flush=True)
    result = {"results": results, "speed": list(SPEED)}
    return str(write("attention", {**result, "rows": labelled(_labels(SPEED), figures(result))}))


if __name__ == "__main__":
    print(run())
