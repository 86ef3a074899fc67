"""Steps 2-4 of a run: data, model (+ surgery, + autotune), device placement, optimizer and
scheduler, gathered in one Parts record for the training loop."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.swa_utils import AveragedModel

from turbotrain.compression import COMPRESSION
from turbotrain.core.modules import count_flops
from turbotrain.core.schema import ConfigError
from turbotrain.data import DataBundle, build_data
from turbotrain.data.loader import EpochSampler, build_loader, epoch_seed_cell
from turbotrain.data.mixing import build_mix
from turbotrain.data.resolution import Resolution, warn_if_maps_collapse
from turbotrain.models import build_for, build_tokenizer_for
from turbotrain.models.attention.options import ATTENTION
from turbotrain.train import collectives as col
from turbotrain.train import distributed as dist
from turbotrain.train.autotune import apply_choice, autotune, choice_from_checkpoint
from turbotrain.train.ema import build_ema, load_ema
from turbotrain.train.numerics import resolve
from turbotrain.train.optim import build_optimizer
from turbotrain.train.precision import Precision, build_precision
from turbotrain.train.preemption import StopFlag
from turbotrain.train.resume import check_data
from turbotrain.train.sched import build_scheduler
from turbotrain.train.surgery import apply_surgery, initial_weights
from turbotrain.train.tracking import process_age_s

log = logging.getLogger("turbotrain")


@dataclass
class Loaders:
    sampler: EpochSampler
    epoch_seed: torch.Tensor  # seeds each training batch's augmentation (SeededBatches), set per epoch and rank
    train: torch.utils.data.DataLoader
    val: torch.utils.data.DataLoader
    batches_in_epoch: int
    steps_per_epoch: int
    total_steps: int


@dataclass
class Parts:
    data: DataBundle
    model: nn.Module  # the plain model (checkpoints, FLOPs)
    train_model: nn.Module  # what runs the steps: possibly compiled and DDP-wrapped
    precision: Precision
    loaders: Loaders
    optimizer: torch.optim.Optimizer
    scheduler: object
    params: int
    flops: int | None
    compression: dict | None  # what apply_compression changed and measured
    # (inputs, target, step) -> (inputs, target): the training batch on its device, at the step's
    # resolution (data.resolution) and mixed (mixup/cutmix: soft targets); None when neither is on
    on_device: Callable | None
    autotune: dict | None  # trainer.autotune's table and choice
    ema: AveragedModel | None  # trainer.ema_decay: the weight average
    # the process's age as each part of start-up ended (summary.json's startup_s, by phase)
    startup: dict[str, float]


def build(
    cfg,
    info: dist.DistInfo,
    device: torch.device,
    stop: StopFlag,
    resume_ckpt: dict | None = None,
    resume_path: Path | None = None,
) -> Parts:
    """Steps 2-4. The run-time choices that change the numbers (numerics.resolve, and
    trainer.autotune's measured one) are written into `cfg`, which is the run's effective config
    from here on (checkpoints save it; resume reuses it). `stop`: the run's stop request, polled
    by compression's evaluations and fine-tuning and autotune's trials."""
    startup = {"python, imports, config, run dir": process_age_s()}
    with dist.rank_zero_first(info):  # downloads and decoded caches: once per job (or node)
        data, model = _data_and_model(cfg)
    startup["data, model"] = process_age_s()
    if resume_ckpt is not None:
        check_data(resume_ckpt, data, resume_path, cfg.trainer.resume_strict)
    initial_weights(model, cfg, data, resume_ckpt, resume_path)
    startup["initial weights (whitening fit, checkpoint)"] = process_age_s()
    loaders = _loaders(cfg, data, info, device)
    compression = apply_surgery(cfg, model, data.kind, loaders.train, loaders.val, resume_ckpt is not None, stop)
    params, flops = sum(p.numel() for p in model.parameters()), count_flops(model, _flop_example(data))
    resize = _resolution(cfg, data, model, loaders.total_steps)
    resolve(cfg, model, device, partial(col.agree_max, group=info.cpu_group), resume_ckpt)  # recorded in cfg
    tuned = _autotune(cfg, data, model, device, info, loaders, resume_ckpt, stop)
    if tuned is not None and cfg.loader.num_workers != loaders.train.num_workers:
        loaders = _loaders(cfg, data, info, device)
    train_model = _placed(cfg, model, info, device)
    optimizer = build_optimizer(model, cfg.optim)
    scheduler = build_scheduler(
        optimizer, cfg.sched, cfg.optim, total_steps=loaders.total_steps, steps_per_epoch=loaders.steps_per_epoch
    )
    precision = build_precision(cfg.precision, device)
    ema = build_ema(model, cfg.trainer)
    if ema is not None and resume_ckpt is not None and resume_ckpt.get("ema"):  # else it starts from these weights
        load_ema(ema, resume_ckpt["ema"])
    on_device = _on_device(resize, build_mix(cfg.data, data.kind, data.num_classes))
    parts = (data, model, train_model, precision, loaders, optimizer, scheduler, params, flops, compression, on_device, tuned)
    startup["loaders, compression, autotune, optimizer"] = process_age_s()
    return Parts(*parts, ema, startup)


def _data_and_model(cfg) -> tuple[DataBundle, nn.Module]:
    max_length = cfg.data.max_length or 0  # text data only (image options compose it as null)
    tokenizer = build_tokenizer_for(cfg.model, max_length)
    data = build_data(cfg.data, tokenizer)
    if len(data.val) == 0:
        raise ConfigError(f"data={cfg.data.name}: the validation split is empty ({_val_source(cfg.data)}): give it samples")
    if cfg.data.bucket_by_length and data.kind != "text":
        raise ConfigError("data.bucket_by_length=true applies to text data (images all have one size)")
    if cfg.trainer.tta != "none" and data.kind != "image":
        raise ConfigError(f"trainer.tta={cfg.trainer.tta} augments images; data={cfg.data.name} is text: set trainer.tta=none")
    if cfg.trainer.ema_decay is not None and COMPRESSION.of(cfg.compression).traits.get("reapply_on_resume"):
        raise ConfigError(
            f"trainer.ema_decay with compression={cfg.compression.name}: the average cannot follow its masks; "
            "fine-tune without it (trainer.ema_decay=null)"
        )
    return data, build_for(cfg.model, data, tokenizer, max_length)


def _val_source(data_cfg) -> str:
    """The key that chose the validation samples, for the error that found none."""
    for key in ("val_split", "val_fraction", "val_path"):
        if data_cfg.get(key) is not None:  # image options compose every key, null where unused
            return f"data.{key}={data_cfg[key]}"
    return f"data.root={data_cfg.root}: its val/ folder or val-*.tar shards"


def _on_device(resize: Resolution | None, mix: Callable | None) -> Callable | None:
    if resize is None and mix is None:
        return None

    def transform(inputs, target, step: int):
        if resize is not None:
            inputs = resize(inputs, step)
        return mix(inputs, target) if mix is not None else (inputs, target)

    return transform


def _flop_example(data: DataBundle):
    """A batch of one for FLOP counting. Images: zeros of the nominal size, so a corrupt first
    validation file cannot stop the run here; text: the first validation sample."""
    if data.kind == "image":
        return torch.zeros(1, data.in_channels, data.image_size, data.image_size)
    return data.collate([data.val[0]])[0]


def _loaders(cfg, data: DataBundle, info: dist.DistInfo, device: torch.device) -> Loaders:
    tc, batch = cfg.trainer, cfg.data.batch_size
    lengths = data.train.lengths() if cfg.data.bucket_by_length else None
    sampler = EpochSampler(
        len(data.train), tc.seed, rank=info.rank, world_size=info.world_size, lengths=lengths, batch_size=batch
    )
    full_batches = len(sampler) // batch
    if full_batches == 0:
        raise ConfigError(
            f"data.batch_size={batch} is larger than this rank's share of the training set ({len(sampler)} samples): lower it"
        )
    batches_in_epoch = min(full_batches, tc.limit_train_batches or full_batches)
    steps_per_epoch = math.ceil(batches_in_epoch / tc.grad_accum_steps)
    total_steps = int(min(tc.max_epochs * steps_per_epoch, tc.max_steps or math.inf))
    epoch_seed = epoch_seed_cell()
    common = {"loader_cfg": cfg.loader, "device": device, "collate_fn": data.collate}
    train = build_loader(
        data.train, batch_size=batch, sampler=sampler, train=True, epoch_seed=epoch_seed, on_device=data.train_on_device, **common
    )
    val_lengths = data.val.lengths() if cfg.data.bucket_by_length else None
    val_sampler = EpochSampler(
        len(data.val), 0, shuffle=False, rank=info.rank, world_size=info.world_size, pad=False, lengths=val_lengths
    )
    val = build_loader(data.val, batch_size=cfg.data.eval_batch_size or 2 * batch, sampler=val_sampler, train=False, **common)
    return Loaders(sampler, epoch_seed, train, val, batches_in_epoch, steps_per_epoch, total_steps)


def _resolution(cfg, data: DataBundle, model: nn.Module, total_steps: int) -> Resolution | None:
    if data.kind != "image" or cfg.data.resolution == "fixed":
        return None
    resolution = Resolution(cfg.data, data.image_size, total_steps, cfg.trainer.seed)
    warn_if_maps_collapse(model, data.in_channels, resolution, cfg.model.name)
    return resolution


def _autotune(
    cfg, data, model, device, info: dist.DistInfo, loaders: Loaders, resume_ckpt: dict | None, stop: StopFlag
) -> dict | None:
    """trainer.autotune (or loader=tuned: the worker count alone, by real steps); the choice is
    applied to `cfg` and the model. A resumed run keeps its first session's choice."""
    tc = cfg.trainer
    if not (tc.autotune or cfg.loader.auto_workers):
        return None
    if resume_ckpt is not None:
        tuned = {"chosen": choice_from_checkpoint(resume_ckpt), "from_checkpoint": True}
    else:
        knobs = list(tc.autotune_knobs) if tc.autotune else ["num_workers"]
        tuned = autotune(cfg, data, model, device, loaders.total_steps, col.summer(info), knobs, stop)
    apply_choice(cfg, tuned["chosen"])
    if data.kind == "text" and ATTENTION.of(cfg.attention).traits.get("kernels"):  # full attention, tuned or swapped in
        model.set_attn_implementation(cfg.attention.implementation)
    return tuned


def _placed(cfg, model: nn.Module, info: dist.DistInfo, device: torch.device) -> nn.Module:
    """The model on its device and memory format; what runs the steps: compiled, DDP-wrapped."""
    tc = cfg.trainer
    if info.enabled:
        torch.manual_seed(tc.seed + info.rank)  # same init everywhere (broadcast by DDP), own dropout stream per rank
    model.to(device)
    if tc.channels_last:
        model.to(memory_format=torch.channels_last)
    train_model = torch.compile(model) if tc.compile else model
    if not info.enabled:
        return train_model
    if cfg.distributed.sync_bn:
        if device.type != "cuda":
            raise ConfigError("distributed.sync_bn=true needs CUDA (torch's SyncBatchNorm has no CPU kernel)")
        train_model = nn.SyncBatchNorm.convert_sync_batchnorm(train_model)
    if device.type == "cuda":
        return DistributedDataParallel(train_model, device_ids=[device.index])
    return DistributedDataParallel(train_model, process_group=info.cpu_group)  # CPU tensors: the gloo group
