"""Steps 2-4 of a run: data, model (+ surgery, + autotune), device placement, optimizer and
scheduler, gathered in one Parts record for the training loop."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.flop_counter import FlopCounterMode

from turbotrain import distributed as dist
from turbotrain.autotune import apply_choice, autotune, choice_from_checkpoint
from turbotrain.config import ConfigError
from turbotrain.data import DataBundle, build_data
from turbotrain.data.loader import EpochSampler, build_loader
from turbotrain.data.resolution import Resolution, warn_if_maps_collapse
from turbotrain.models import build_for, build_tokenizer_for
from turbotrain.optim import build_optimizer
from turbotrain.precision import Precision, build_precision
from turbotrain.sched import build_scheduler
from turbotrain.surgery import apply_surgery, initial_weights

log = logging.getLogger("turbotrain")


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"trainer.device={name}: CUDA is not available here; use auto or cpu")
    return device


def count_flops(model: nn.Module, batch) -> int | None:
    """Forward FLOPs of a batch of one (torch's own counter; None where it cannot run)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(**batch) if isinstance(batch, dict) else model(batch)
        return int(counter.get_total_flops())
    except Exception:  # exotic ops: FLOPs are informative only
        return None
    finally:
        model.train(was_training)


def _flop_example(data: DataBundle):
    """A batch of one for FLOP counting. Images: zeros of the nominal size, so a corrupt first
    validation file cannot stop the run here; text: the first validation sample."""
    if data.kind == "image":
        return torch.zeros(1, data.in_channels, data.image_size, data.image_size)
    return data.collate([data.val[0]])[0]


@dataclass
class Parts:
    data: DataBundle
    model: nn.Module  # the plain model (checkpoints, FLOPs)
    train_model: nn.Module  # what runs the steps: possibly compiled and DDP-wrapped
    precision: Precision
    sampler: EpochSampler
    loader_rng: torch.Generator
    train_loader: torch.utils.data.DataLoader
    val_loader: torch.utils.data.DataLoader
    optimizer: torch.optim.Optimizer
    scheduler: object
    batches_in_epoch: int
    params: int
    flops: int | None
    compression: dict | None  # what apply_compression changed and measured
    resize: Resolution | None  # per-batch training resolution (images)
    autotune: dict | None  # trainer.autotune's table and choice


def _loaders(cfg, data: DataBundle, sampler: EpochSampler, loader_rng: torch.Generator, info, device):
    common = {"loader_cfg": cfg.loader, "device": device, "collate_fn": data.collate}
    train = build_loader(data.train, batch_size=cfg.data.batch_size, sampler=sampler, train=True, generator=loader_rng, **common)
    val_sampler = EpochSampler(len(data.val), 0, shuffle=False, rank=info.rank, world_size=info.world_size, pad=False)
    val_bs = cfg.data.eval_batch_size or 2 * cfg.data.batch_size
    return train, build_loader(data.val, batch_size=val_bs, sampler=val_sampler, train=False, **common)


def build(
    cfg, info: dist.DistInfo, device: torch.device, resume_ckpt: dict | None = None, resume_path: Path | None = None
) -> Parts:
    """Steps 2-4. With trainer.autotune the measured choice is written into `cfg`, which is the
    run's effective config from here on (checkpoints save it; resume reuses it)."""
    tc = cfg.trainer
    tokenizer = build_tokenizer_for(cfg.model, cfg.data.max_length)
    data = build_data(cfg.data, tokenizer)
    if len(data.val) == 0:
        raise ConfigError(f"data={cfg.data.name}: the validation split is empty: give it samples (val/ images, val_fraction)")
    model = build_for(cfg.model, data, tokenizer, cfg.data.max_length)
    initial_weights(model, cfg, resume_ckpt, resume_path)
    bucketed = cfg.data.bucket_by_length
    if bucketed and data.kind != "text":
        raise ConfigError("data.bucket_by_length=true applies to text data (images all have one size)")
    sampler = EpochSampler(
        len(data.train),
        tc.seed,
        rank=info.rank,
        world_size=info.world_size,
        lengths=data.train.lengths() if bucketed else None,
        batch_size=cfg.data.batch_size,
    )
    full_batches = len(sampler) // cfg.data.batch_size
    if full_batches == 0:
        raise ConfigError(
            f"data.batch_size={cfg.data.batch_size} is larger than this rank's share of the training set "
            f"({len(sampler)} samples): lower it"
        )
    batches_in_epoch = min(full_batches, tc.limit_train_batches or full_batches)
    steps_per_epoch = math.ceil(batches_in_epoch / tc.grad_accum_steps)
    total_steps = min(tc.max_epochs * steps_per_epoch, tc.max_steps or math.inf)
    loader_rng = torch.Generator()
    train_loader, val_loader = _loaders(cfg, data, sampler, loader_rng, info, device)
    compression = apply_surgery(cfg, model, data.kind, train_loader, val_loader, resumed=resume_ckpt is not None)
    params = sum(p.numel() for p in model.parameters())
    flops = count_flops(model, _flop_example(data))
    resolution = None
    if data.kind == "image" and cfg.data.resolution != "fixed":
        resolution = Resolution(cfg.data, data.image_size, total_steps, tc.seed)
        warn_if_maps_collapse(model, data.in_channels, resolution, cfg.model.name)
    tuned = None
    if tc.autotune or cfg.loader.auto_workers:  # loader=tuned: the worker count alone, by real steps
        workers = cfg.loader.num_workers
        if resume_ckpt is not None:
            tuned = {"chosen": choice_from_checkpoint(resume_ckpt), "from_checkpoint": True}
        else:
            knobs = list(tc.autotune_knobs) if tc.autotune else ["num_workers"]
            reduce = dist.all_reduce_sum if info.enabled else None
            tuned = autotune(cfg, data, model, device, int(total_steps), reduce, knobs)
        apply_choice(cfg, tuned["chosen"])
        if "attention" in tuned["chosen"]:
            model.set_attn_implementation(tuned["chosen"]["attention"])
        if cfg.loader.num_workers != workers:
            train_loader, val_loader = _loaders(cfg, data, sampler, loader_rng, info, device)
    if info.enabled:
        torch.manual_seed(tc.seed + info.rank)  # same init everywhere, own dropout/augment stream per rank
    model.to(device)
    if tc.channels_last:
        model.to(memory_format=torch.channels_last)
    train_model = torch.compile(model) if tc.compile else model
    if info.enabled:
        if cfg.distributed.sync_bn:
            if device.type != "cuda":
                raise ConfigError("distributed.sync_bn=true needs CUDA (torch's SyncBatchNorm has no CPU kernel)")
            train_model = nn.SyncBatchNorm.convert_sync_batchnorm(train_model)
        train_model = DistributedDataParallel(train_model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = build_optimizer(model, cfg.optim)
    scheduler = build_scheduler(optimizer, cfg.sched, cfg.optim, total_steps=total_steps, steps_per_epoch=steps_per_epoch)
    return Parts(
        data,
        model,
        train_model,
        build_precision(cfg.precision, device),
        sampler,
        loader_rng,
        train_loader,
        val_loader,
        optimizer,
        scheduler,
        batches_in_epoch,
        params,
        flops,
        compression,
        resolution,
        tuned,
    )
