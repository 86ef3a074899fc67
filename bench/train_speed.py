"""Training throughput of the real loop (train_one_epoch) under different settings, interleaved.

Data are synthetic (speed only) and already in memory, so the model and the loop are measured,
not the input pipeline. Each call runs `steps` optimizer steps and returns samples/s.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from bench.common import ROOT, interleave, labelled, write
from turbotrain.data import build_data
from turbotrain.data.loader import EpochSampler, build_loader
from turbotrain.models import build_for, build_tokenizer_for
from turbotrain.train.loop import TrainState, train_one_epoch
from turbotrain.train.optim import build_optimizer
from turbotrain.train.precision import build_precision
from turbotrain.train.tracking import Tracker


def make_cfg(*overrides: str):
    """The training config `train.py <overrides>` would run, composed in this process."""
    from hydra import compose, initialize_config_dir

    import turbotrain.options  # noqa: F401  (fills the option registries)
    from turbotrain.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=["trainer.progress_bar=false", *overrides])


def trainer(cfg, steps: int):
    """A closure running `steps` real training steps of `cfg`; returns samples/s."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = build_tokenizer_for(cfg.model, cfg.data.max_length)
    data = build_data(cfg.data, tokenizer)
    model = build_for(cfg.model, data, tokenizer, cfg.data.max_length).to(device)
    if data.kind == "text":
        from turbotrain.models.attention.options import apply_attention

        apply_attention(model, cfg.attention)
    if cfg.trainer.channels_last:
        model.to(memory_format=torch.channels_last)
    train_model = torch.compile(model) if cfg.trainer.compile else model
    precision = build_precision(cfg.precision, device)
    optimizer = build_optimizer(model, cfg.optim)
    lengths = data.train.lengths() if cfg.data.bucket_by_length else None
    sampler = EpochSampler(len(data.train), 0, lengths=lengths, batch_size=cfg.data.batch_size)
    loader = build_loader(
        data.train,
        batch_size=cfg.data.batch_size,
        sampler=sampler,
        loader_cfg=cfg.loader,
        device=device,
        train=True,
        collate_fn=data.collate,
    )
    tracker = Tracker(".", enabled=False, logger_cfg=cfg.logger, config={})
    state = TrainState()

    def run() -> float:
        state.batch_in_epoch = 0
        t0 = time.perf_counter()
        stats = train_one_epoch(
            train_model,
            loader,
            optimizer,
            None,
            precision,
            state,
            trainer_cfg=cfg.trainer,
            device=device,
            tracker=tracker,
            batches_in_epoch=steps,
        )
        if device.type == "cuda":
            torch.cuda.synchronize()
        return stats["samples"] / (time.perf_counter() - t0)

    run()  # warm-up: allocator, oneDNN primitive cache, compile
    return run


def _medians(result: dict) -> dict[str, float]:
    return {name: statistics.median(r["values"]) for name, r in result["results"].items()}


def precision_figures(result: dict) -> list[dict]:
    r = _medians(result)
    base, cl, compiled = r["fp32 NCHW"], r["amp channels_last"], r["amp channels_last compiled"]
    return [
        {"ours": f"{r['amp NCHW'] / base:.2f}x ({r['amp NCHW']:.0f} vs {base:.0f} samples/s)", "ratio": r["amp NCHW"] / base},
        {"ours": f"{cl / base:.2f}x ({cl:.0f} samples/s)", "ratio": cl / base},
        {"ours": f"{r['fp32 channels_last'] / base:.2f}x", "ratio": r["fp32 channels_last"] / base},
        {
            "ours": f"{compiled / cl:.2f}x ({compiled:.0f} vs {cl:.0f} samples/s; compile time not included, autotune weighs it)",
            "ratio": compiled / cl,
        },
    ]


def precision_channels_last(repeats: int = 5, steps: int = 8, size: int = 64, batch: int = 64) -> Path:
    """resnet18 on synthetic images: precision x memory layout, and torch.compile."""
    base = (
        "data=synthetic",
        f"data.image_size={size}",
        f"data.num_samples={batch * (steps + 2) * 5 // 4}",
        "model=resnet18",
        f"data.batch_size={batch}",
    )
    settings = {
        "fp32 NCHW": ("precision=fp32", "trainer.channels_last=false"),
        "fp32 channels_last": ("precision=fp32", "trainer.channels_last=true"),
        "amp NCHW": ("precision=amp", "trainer.channels_last=false"),
        "amp channels_last": ("precision=amp", "trainer.channels_last=true"),
        "amp channels_last compiled": ("precision=amp", "trainer.channels_last=true", "trainer.compile=true"),
    }
    fns = {name: trainer(make_cfg(*base, *o), steps) for name, o in settings.items()}
    res = interleave(fns, repeats)
    labels = [
        (f"resnet18 @{size}px training: precision=amp vs fp32", "BERT-base 120 -> 290 samples/s (2.4x, GPU)"),
        (f"resnet18 @{size}px: amp + channels_last vs fp32 NCHW", "~1.47x measured by hand"),
        (f"resnet18 @{size}px: fp32 channels_last vs fp32 NCHW", "-"),
        (f"resnet18 @{size}px amp + channels_last: trainer.compile=true vs eager (steady state)", "-"),
    ]
    rows = labelled(labels, precision_figures({"results": res}))
    return write("precision", {"setup": base, "steps_per_repeat": steps, "results": res, "rows": rows})


def padded_tokens(batch: int) -> dict:
    """Mean tokens per batch after dynamic padding over one epoch of WordNet, random vs bucketed."""
    from turbotrain.models import build_tokenizer_for

    cfg = make_cfg("data=wordnet", "model=minilm", "data.max_length=64")
    data = build_data(cfg.data, build_tokenizer_for(cfg.model, 64))
    lengths = data.train.lengths()
    out = {"real": batch * sum(lengths) / len(lengths)}
    for name, lens in (("random", None), ("bucketed", lengths)):
        order = list(EpochSampler(len(lengths), 0, lengths=lens, batch_size=batch))
        chunks = [order[i : i + batch] for i in range(0, len(order) - batch + 1, batch)]
        out[name] = sum(batch * max(lengths[j] for j in c) for c in chunks) / len(chunks)
    return out


def text_figures(result: dict) -> list[dict]:
    r, tokens, steps = _medians(result), result["tokens"], result["steps_per_repeat"]
    bucketed, amp = r["amp sdpa bucketed"], r["amp sdpa"]
    return [
        {"ours": f"{amp / r['fp32 sdpa']:.2f}x ({amp:.0f} vs {r['fp32 sdpa']:.0f} samples/s)", "ratio": amp / r["fp32 sdpa"]},
        {
            "ours": f"amp {r['amp eager'] / amp:.2f}x, fp32 {r['fp32 eager'] / r['fp32 sdpa']:.2f}x "
            f"({r['amp eager']:.0f} vs {amp:.0f} samples/s under amp)",
            "ratio": r["amp eager"] / amp,
        },
        {
            "ours": f"{bucketed / amp:.2f}x ({bucketed:.0f} vs {amp:.0f} samples/s over {steps} batches); over a whole epoch, "
            f"tokens per batch {tokens['bucketed']:.0f} vs {tokens['random']:.0f} (real tokens {tokens['real']:.0f})",
            "ratio": bucketed / amp,
        },
    ]


def text_precision(repeats: int = 5, steps: int = 16, batch: int = 32) -> Path:
    """MiniLM-L6 fine-tuning steps on WordNet definitions (batch 32, dynamic padding to <= 64
    tokens): amp (bf16 autocast) vs fp32, SDPA vs eager attention kernels, and length bucketing.
    Steps of one setting always see the same batches; bucketed batches are the bucketed order's."""
    base = ("data=wordnet", "model=minilm", f"data.batch_size={batch}", "data.max_length=64", "optim=adamw", "optim.lr=5e-5")
    settings = {
        "fp32 sdpa": ("precision=fp32", "attention.implementation=sdpa"),
        "amp sdpa": ("precision=amp", "attention.implementation=sdpa"),
        "amp eager": ("precision=amp", "attention.implementation=eager"),
        "fp32 eager": ("precision=fp32", "attention.implementation=eager"),
        "amp sdpa bucketed": ("precision=amp", "attention.implementation=sdpa", "data.bucket_by_length=true"),
    }
    fns = {name: trainer(make_cfg(*base, *o), steps) for name, o in settings.items()}
    res = interleave(fns, repeats)
    tokens = padded_tokens(batch)
    labels = [
        (
            f"MiniLM-L6 fine-tuning, WordNet, batch {batch}: precision=amp vs fp32 (sdpa)",
            "BERT-base 120 -> 290 samples/s (2.4x), 10.2 -> 5.7 GB (GPU)",
        ),
        (
            "MiniLM-L6 fine-tuning: attention.implementation=eager vs sdpa",
            "eager faster for bf16 backward on this CPU (earlier measurement)",
        ),
        ("MiniLM-L6 fine-tuning, amp: data.bucket_by_length=true vs random batches (dynamic padding both)", "-"),
    ]
    payload = {"setup": base, "steps_per_repeat": steps, "results": res, "tokens": tokens}
    rows = labelled(labels, text_figures(payload))
    return write("text_precision", {**payload, "rows": rows})
