"""Full vs sliding-window attention on MiniLM-L6 training steps: step time and peak memory.

Each measurement runs in its own process (the CPU peak-RSS high-water mark only grows), with
configurations interleaved across repeats. Random token ids (speed and memory only); the model is
MiniLM-L6's architecture (pretrained weights do not change speed). Batch 2, fp32.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from bench.common import labelled, write

CONFIGS = {
    "full (attn dropout 0.1: unfused)": {"name": "full", "dropout": 0.1},
    "full (attn dropout 0: fused SDPA)": {"name": "full", "dropout": 0.0},
    "sliding w=256": {"name": "sliding_window", "window": 256, "dropout": 0.0},
    "full fused + checkpointing": {"name": "full", "dropout": 0.0, "checkpointing": True},
    "sliding w=256 + checkpointing": {"name": "sliding_window", "window": 256, "dropout": 0.0, "checkpointing": True},
}


def measure(attention: dict, length: int, steps: int = 2) -> dict:
    """One process: build, warm up, time `steps` training steps; peak RSS growth over the steps."""
    import torch
    from omegaconf import OmegaConf

    from turbotrain.attention import apply_attention
    from turbotrain.models.text import build_text_model

    torch.manual_seed(0)
    model = build_text_model(OmegaConf.create({"name": "minilm"}), 6, length, vocab_size=30522)
    base = {"implementation": "sdpa", "window": 256, "block": None, "global_tokens": 1, "checkpointing": False}
    apply_attention(model, OmegaConf.create({**base, **attention}))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(1000, 30000, (2, length))
    mask = torch.ones_like(ids)
    y = torch.tensor([0, 1])

    def step():
        loss = torch.nn.functional.cross_entropy(model(input_ids=ids, attention_mask=mask).logits, y)
        loss.backward()
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


UNFUSED_MAX = 2048  # the unfused path's n x n probabilities need ~37 GB at 4096 tokens


def figures(result: dict) -> list[dict]:
    """Per length: sliding window against fused (and unfused) full attention, medians over repeats."""
    rows = []
    for by_name in result["results"].values():
        med = {name: {k: sorted(r[k] for r in rs)[len(rs) // 2] for k in rs[0]} for name, rs in by_name.items()}
        fused, sw = med["full (attn dropout 0: fused SDPA)"], med["sliding w=256"]
        unfused = med.get("full (attn dropout 0.1: unfused)")
        vs_unfused = (
            f"{unfused['step_s'] / sw['step_s']:.2f}x faster than unfused ({unfused['train_mem_mb']:.0f} MB), " if unfused else ""
        )
        rows.append(
            {
                "ours": f"{vs_unfused}{fused['step_s'] / sw['step_s']:.2f}x vs fused SDPA ({sw['step_s']:.1f} vs "
                f"{fused['step_s']:.1f} s/step); training memory above the model {sw['train_mem_mb']:.0f} vs "
                f"{fused['train_mem_mb']:.0f} MB (peak RSS {sw['peak_rss_mb']:.0f} vs {fused['peak_rss_mb']:.0f} MB)",
                "ratio": fused["step_s"] / sw["step_s"],
            }
        )
    return rows


def run(lengths=(512, 1024, 2048, 4096), repeats: int = 1) -> str:
    results: dict = {}
    for _ in range(repeats):
        for length in lengths:
            for name, attention in CONFIGS.items():
                if "unfused" in name and length > UNFUSED_MAX:
                    continue
                code = f"import json; from bench.attention import measure; print(json.dumps(measure({attention!r}, {length})))"
                out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
                results.setdefault(f"{length}", {}).setdefault(name, []).append(json.loads(out.stdout.strip().splitlines()[-1]))
                print(length, name, results[f"{length}"][name][-1], flush=True)
    labels = [
        (
            f"MiniLM training step @{length} tokens, batch 2: sliding w=256 vs full attention",
            "512 -> 2048 tokens, 2.1x faster" if length == "2048" else "-",
        )
        for length in results
    ]
    rows = labelled(labels, figures({"results": results}))
    return str(write("attention", {"results": results, "rows": rows}))


if __name__ == "__main__":
    print(run())
