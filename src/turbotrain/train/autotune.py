"""trainer.autotune: time a few real training steps of each setting that leaves the numerics
alone (channels_last, torch.compile, loader workers; for text models with full attention, the
sdpa or eager kernel) and keep the one that finishes the run soonest. The precision stays what
the user chose. One setting that changes the model, sliding-window vs full attention
(`attention_kernel`), is timed only when trainer.autotune_knobs lists it.

Trials run on a copy of the model with their own optimizer, on the first batches of epoch 0,
and the RNG state is restored afterwards, so the run itself starts exactly as it would have
without them. A setting's cost is its first step (compilation, worker start-up) plus the
remaining steps at its median step time: compile wins only when the run is long enough to
pay for it."""

from __future__ import annotations

import copy
import itertools
import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from omegaconf import OmegaConf
from torch import nn

from turbotrain.core import checkpoint as ckpt_io
from turbotrain.core.schema import ConfigError
from turbotrain.data.loader import EpochSampler, build_loader
from turbotrain.models.attention.options import ATTENTION
from turbotrain.train.loop import short_run
from turbotrain.train.precision import build_precision
from turbotrain.train.preemption import Preempted, StopFlag

log = logging.getLogger("turbotrain")

WARMUP = 2  # steps not counted in the median step time (first call, allocator, worker start-up)


@dataclass
class Trial:
    setting: dict
    first_step_s: float = math.inf  # process-visible cost of the first step (compile, workers)
    step_s: float = math.inf  # median steady-state step time
    error: str | None = None
    projected: float = math.inf  # projected run time, summed over DDP ranks

    def projected_s(self, steps: int) -> float:
        return self.first_step_s + max(0, steps - 1) * self.step_s


def _time_setting(cfg, data, model: nn.Module, device: torch.device, setting: dict, steps: int, stop: StopFlag) -> Trial:
    trial = Trial(setting)
    m = copy.deepcopy(model).to(device)
    if setting["channels_last"]:
        m.to(memory_format=torch.channels_last)
    if "attention" in setting:
        m.set_attn_implementation(setting["attention"])
    if setting.get("attention_kernel") in _approximated(cfg):
        m.set_attn_implementation(_approximated(cfg)[setting["attention_kernel"]])
    loader_cfg = OmegaConf.merge(cfg.loader, {"num_workers": setting["num_workers"], "persistent_workers": False})
    loader = build_loader(
        data.train,
        batch_size=cfg.data.batch_size,
        sampler=EpochSampler(len(data.train), cfg.trainer.seed),
        loader_cfg=loader_cfg,
        device=device,
        train=True,
        collate_fn=data.collate,
        on_device=data.train_on_device,
    )
    ends = [time.perf_counter()]
    try:
        short_run(
            torch.compile(m) if setting["compile"] else m,
            loader,
            cfg,
            device=device,
            precision=build_precision(cfg.precision, device),
            batches=min(len(loader), WARMUP + steps),
            on_step=lambda _: (ends.append(time.perf_counter()), stop.stop_now("autotune trials")),
            channels_last=setting["channels_last"],
            grad_accum_steps=1,
            log_every_n_steps=10**9,
        )
    except Preempted:
        raise
    except Exception as e:  # e.g. torch.compile without a C compiler: that setting is out
        trial.error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        return trial
    gaps = [b - a for a, b in itertools.pairwise(ends)]
    if len(gaps) <= WARMUP:
        trial.error = "too few batches to time"
        return trial
    trial.step_s = statistics.median(gaps[WARMUP:])
    trial.first_step_s = sum(gaps[:WARMUP]) - (WARMUP - 1) * trial.step_s
    return trial


def candidates(cfg, kind: str, knobs: list[str]) -> tuple[list[dict], list[int]]:
    """Model settings for stage 1 (at the configured workers) and worker counts for stage 2.
    `knobs`: trainer.autotune_knobs (a subset of KNOBS)."""
    tc = cfg.trainer
    layouts = [False, True] if "channels_last" in knobs and kind == "image" else [bool(tc.channels_last)]
    compiles = [False, True] if "compile" in knobs else [bool(tc.compile)]
    base = int(cfg.loader.num_workers)
    stage1 = [{"channels_last": c, "compile": k, "num_workers": base} for c, k in itertools.product(layouts, compiles)]
    kernels = ATTENTION.of(cfg.attention).traits.get("kernels")  # sliding_window is a different function: not a knob
    if kind == "text" and kernels:
        kernels = list(kernels) if "attention" in knobs else [cfg.attention.implementation]
        stage1 = [{**s, "attention": a} for s in stage1 for a in kernels]
    if kind == "text" and "attention_kernel" in knobs and _approximated(cfg):
        stage1 = [{**s, "attention_kernel": k} for s in stage1 for k in (cfg.attention.name, *_approximated(cfg))]
    workers = sorted({int(w) for w in cfg.loader.auto_candidates} - {base}) if "num_workers" in knobs else []
    return stage1, workers


def _approximated(cfg) -> dict[str, str]:
    """{option the configured attention approximates: its full-attention kernel}, or {} (the
    attention_kernel knob has nothing to swap)."""
    other = ATTENTION.of(cfg.attention).traits.get("approximates")
    return {other: ATTENTION[other].traits["kernels"][0]} if other else {}


def autotune(
    cfg,
    data,
    model: nn.Module,
    device: torch.device,
    total_steps: int,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None,
    knobs: list[str],
    stop: StopFlag,
) -> dict:
    """Measure the `knobs`, pick, and return {"chosen": setting, "table": [...], "seconds": s}.
    `reduce` (a sum across DDP ranks) makes every rank pick the same setting from the summed times."""
    t0, rng = time.perf_counter(), ckpt_io.rng_state()
    steps = int(cfg.trainer.autotune_steps)

    def measure(settings: list[dict]) -> list[Trial]:
        trials = [_time_setting(cfg, data, model, device, s, steps, stop) for s in settings]
        cost = torch.tensor([t.projected_s(total_steps) for t in trials], dtype=torch.float64)
        if reduce is not None:
            cost = reduce(cost)
        for t, c in zip(trials, cost.tolist(), strict=True):
            t.projected = c
        return trials

    stage1, workers = candidates(cfg, data.kind, knobs)
    # one untimed eager trial first: the process's one-time costs (lazy init, kernel caches,
    # allocator growth) would otherwise count against whichever setting is timed first
    _time_setting(cfg, data, model, device, {**stage1[0], "compile": False}, 1, stop)
    trials = measure(stage1)
    best = min(trials, key=lambda t: t.projected)
    trials += measure([{**best.setting, "num_workers": w} for w in workers])
    best = min(trials, key=lambda t: t.projected)
    ckpt_io.set_rng_state(rng)
    if not math.isfinite(best.projected):
        raise ConfigError(f"trainer.autotune: no setting could train ({trials[0].error}); set trainer.autotune=false")
    table = [
        {
            **t.setting,
            "step_ms": round(1000 * t.step_s, 2) if math.isfinite(t.step_s) else None,
            "first_step_s": round(t.first_step_s, 2) if math.isfinite(t.first_step_s) else None,
            "projected_run_s": round(t.projected, 3) if math.isfinite(t.projected) else None,
            **({"error": t.error} if t.error else {}),
        }
        for t in trials
    ]
    seconds = time.perf_counter() - t0
    lines = [f"  {'*' if t is best else ' '} {row}" for t, row in zip(trials, table, strict=True)]
    log.info("autotune %s (%d steps each, %.1f s, run of %d steps):\n%s", knobs, steps, seconds, total_steps, "\n".join(lines))
    return {"chosen": best.setting, "table": table, "seconds": round(seconds, 2)}


def apply_choice(cfg, chosen: dict) -> None:
    """The tuned values become the run's effective config (saved in every checkpoint)."""
    OmegaConf.update(cfg, "trainer.channels_last", bool(chosen["channels_last"]))
    OmegaConf.update(cfg, "trainer.compile", bool(chosen["compile"]))
    OmegaConf.update(cfg, "loader.num_workers", int(chosen["num_workers"]))
    if "attention" in chosen:
        OmegaConf.update(cfg, "attention.implementation", chosen["attention"])
    kernel = chosen.get("attention_kernel")
    if kernel in _approximated(cfg):
        OmegaConf.update(cfg, "attention.implementation", _approximated(cfg)[kernel])
        OmegaConf.update(cfg, "attention.name", kernel)


def choice_from_checkpoint(ckpt: dict) -> dict:
    """A resumed run keeps the setting its first session chose (no new trials)."""
    saved = OmegaConf.create(ckpt["config"])
    chosen = {
        "channels_last": bool(saved.trainer.channels_last),
        "compile": bool(saved.trainer.compile),
        "num_workers": int(saved.loader.num_workers),
    }
    if ckpt["arch"]["kind"] == "text" and ATTENTION.of(saved.attention).traits.get("kernels"):
        chosen["attention"] = saved.attention.implementation
    if ckpt["arch"]["kind"] == "text":
        chosen["attention_kernel"] = saved.attention.name  # the run's effective attention
    return chosen
