"""train_one_epoch / evaluate as plain functions (export reuses evaluate)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn import functional as F

from turbotrain import preemption
from turbotrain.precision import Precision
from turbotrain.tracking import Tracker, gpu_util, peak_mem_mb


@dataclass
class TrainState:
    epoch: int = 0
    global_step: int = 0  # optimizer steps taken
    batch_in_epoch: int = 0  # micro-batches of the current epoch already consumed
    best_val_acc1: float = -1.0
    skipped_steps: int = 0  # optimizer steps skipped for inf/NaN gradients or losses
    nan_streak: int = 0  # consecutive steps skipped for a non-finite loss
    bad_samples: int = 0  # samples that failed to load and were skipped
    samples_seen: int = 0
    train_time_s: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


class Diverged(RuntimeError):
    """The loss stayed non-finite (trainer.on_nan=stop, or nan_patience exhausted), or the weights did."""

    def __init__(self, step: int, reason: str):
        super().__init__(f"{reason} at step {step}")
        self.step = step


def to_device(batch, device: torch.device, channels_last: bool = False):
    """(inputs, target) on `device`; a third element (samples dropped as bad) is ignored here."""
    inputs, target = batch[0], batch[1]
    if isinstance(inputs, dict):
        inputs = {k: v.to(device, non_blocking=True) for k, v in inputs.items()}
    else:
        fmt = torch.channels_last if channels_last and inputs.ndim == 4 else torch.preserve_format
        inputs = inputs.to(device, non_blocking=True, memory_format=fmt)
    return inputs, target.to(device, non_blocking=True)


def forward(model: nn.Module, inputs) -> torch.Tensor:
    out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
    return out.logits if hasattr(out, "logits") else out


def topk_correct(logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    k = min(5, logits.shape[-1])
    top = logits.topk(k, dim=-1).indices
    hit = top.eq(target.unsqueeze(-1))
    return hit[:, 0].sum(), hit.any(-1).sum()


def freeze_bn(model: nn.Module) -> None:
    """BN in eval mode uses and keeps its running statistics: with gradient accumulation
    the statistics stop tracking tiny micro-batches once they are warmed up."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.eval()


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader,
    *,
    device: torch.device,
    precision: Precision,
    max_batches: int | None = None,
    channels_last: bool = False,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> dict:
    """Loss/top-1/top-5 over the loader. `reduce` (e.g. an all_reduce) sums the totals
    across processes before they become means."""
    was_training = getattr(model, "training", False)  # frozen TorchScript modules have no flag
    if was_training:
        model.eval()
    sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss, correct1, correct5, n
    for i, batch in enumerate(loader):
        if (max_batches is not None and i >= max_batches) or preemption.requested() is not None:
            break  # a stop request: the caller discards these partial figures
        inputs, target = to_device(batch, device, channels_last)
        with precision.autocast():
            logits = forward(model, inputs)
        c1, c5 = topk_correct(logits, target)
        loss = F.cross_entropy(logits.float(), target, reduction="sum")
        sums += torch.stack([loss.double(), c1.double(), c5.double(), sums.new_tensor(len(target))])
    if reduce is not None:
        sums = reduce(sums)
    if was_training:
        model.train()
    n = max(sums[3].item(), 1.0)
    return {
        "loss": sums[0].item() / n,
        "acc1": sums[1].item() / n,
        "acc5": sums[2].item() / n,
        "samples": int(sums[3].item()),
    }


def _optimizer_step(model, optimizer, scheduler, precision: Precision, grad_clip: float | None, skip: bool | None) -> bool:
    """Unscale, clip, step, update the scaler. Returns False when the step was skipped: `skip`
    (the group's losses were not finite, agreed across DDP ranks), or the gradient norm was not
    finite (computed when `skip` is None or for clipping; gradients are identical on every DDP
    rank here, so all ranks agree)."""
    scaler = precision.scaler
    if scaler is not None:
        scaler.unscale_(optimizer)
    if scaler is None:
        norm = None
        if skip is None or grad_clip:
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            norm = nn.utils.get_total_norm(grads) if grads else torch.zeros(())
        stepped = not skip and (norm is None or bool(torch.isfinite(norm)))  # with grad_clip the norm is free
        if stepped:
            if grad_clip:
                nn.utils.clip_grads_with_norm_(model.parameters(), grad_clip, norm)
            optimizer.step()
    else:
        if grad_clip:
            nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        scale = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        stepped = scaler.get_scale() >= scale  # the scale only drops when grads were inf/NaN
    optimizer.zero_grad(set_to_none=True)
    if stepped and scheduler is not None:
        scheduler.step()
    return stepped


def train_one_epoch(
    model: nn.Module,
    loader,
    optimizer: torch.optim.Optimizer,
    scheduler,
    precision: Precision,
    state: TrainState,
    *,
    trainer_cfg,
    device: torch.device,
    tracker: Tracker,
    batches_in_epoch: int,
    on_step: Callable[[TrainState], None] | None = None,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    resize: Callable[[torch.Tensor, int], torch.Tensor] | None = None,
) -> dict:
    """One pass over `loader`, which starts at micro-batch `state.batch_in_epoch` of an
    epoch of `batches_in_epoch` micro-batches. Accumulation groups are fixed by position
    in the epoch, so each group's loss is divided by its own length (the last may be short)."""
    accum = trainer_cfg.grad_accum_steps
    max_steps = trainer_cfg.max_steps
    # nan_check=loss: a step is skipped when a loss of its group was not finite (free: no pass over
    # the gradients); grads: when the gradient norm is not finite (one more pass, ~5% on resnet18)
    check_loss = trainer_cfg.nan_check == "loss" and precision.scaler is None
    nonfinite = torch.zeros((), device=device)  # non-finite losses in the current accumulation group
    model.train()
    interval = torch.zeros(3, device=device)  # loss sum, correct1, n
    t_interval, wait_interval, samples_interval = time.perf_counter(), 0.0, 0
    epoch_samples, epoch_start, epoch_wait = 0, time.perf_counter(), 0.0
    bar = tracker.bar(batches_in_epoch, f"epoch {state.epoch}")
    bar.update(state.batch_in_epoch)
    it = iter(loader)
    while state.batch_in_epoch < batches_in_epoch:
        if max_steps is not None and state.global_step >= max_steps:
            break
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        wait = time.perf_counter() - t0
        wait_interval += wait
        epoch_wait += wait
        b = state.batch_in_epoch
        group_start = (b // accum) * accum
        group_len = min(accum, batches_in_epoch - group_start)
        last_in_group = b + 1 == group_start + group_len
        if trainer_cfg.accum_bn == "freeze" and state.global_step >= trainer_cfg.accum_bn_warmup_steps:
            freeze_bn(model)
        inputs, target = to_device(batch, device, trainer_cfg.channels_last)
        if resize is not None:
            inputs = resize(inputs, state.global_step)
        if len(batch) > 2:
            state.bad_samples += int(batch[2])
        sync = contextlib.nullcontext() if last_in_group or not hasattr(model, "no_sync") else model.no_sync()
        with sync:
            with precision.autocast():
                logits = forward(model, inputs)
                loss = F.cross_entropy(logits.float(), target)
            if trainer_cfg.on_nan == "stop" and not torch.isfinite(loss):
                raise Diverged(state.global_step, f"loss is {loss.item()}")
            if check_loss:
                nonfinite += (~torch.isfinite(loss.detach())).float()
            scaled = loss / group_len
            (precision.scaler.scale(scaled) if precision.scaler else scaled).backward()
        n = len(target)
        correct1 = topk_correct(logits.detach(), target)[0].float()
        interval += torch.stack([loss.detach() * n, correct1, loss.new_tensor(n)])
        samples_interval += n
        epoch_samples += n
        state.batch_in_epoch += 1
        state.samples_seen += n
        bar.update(1)
        if not last_in_group:
            continue
        skip = None
        if check_loss:
            skip = bool((reduce(nonfinite) if reduce else nonfinite) > 0)  # every rank skips together
            nonfinite.zero_()
        if _optimizer_step(model, optimizer, scheduler, precision, trainer_cfg.grad_clip, skip):
            state.nan_streak = 0
        else:
            state.skipped_steps += 1
            state.nan_streak += 1
            if state.nan_streak >= trainer_cfg.nan_patience:
                raise Diverged(state.global_step, f"loss is {loss.item()}")
        state.global_step += 1
        if state.global_step % trainer_cfg.log_every_n_steps == 0:
            # every rank reaches this step together: summing across ranks here cannot deadlock
            loss_sum, correct, count = (reduce(interval) if reduce else interval).tolist()
            elapsed = time.perf_counter() - t_interval
            event = {
                "step": state.global_step,
                "epoch": state.epoch,
                "split": "train",
                "loss": loss_sum / count,
                "acc1": correct / count,
                "lr": optimizer.param_groups[0]["lr"],
                "samples_per_s": samples_interval / elapsed,
                "data_wait_frac": wait_interval / elapsed,
                "peak_mem_mb": peak_mem_mb(device),
                "gpu_util": gpu_util(device),
                "skipped_steps": state.skipped_steps,
            }
            tracker.log(**event)
            bar.set_postfix(loss=f"{event['loss']:.3f}", acc=f"{event['acc1']:.3f}", sps=f"{event['samples_per_s']:.0f}")
            interval.zero_()
            t_interval, wait_interval, samples_interval = time.perf_counter(), 0.0, 0
        if on_step is not None:
            on_step(state)
    bar.close()
    elapsed = time.perf_counter() - epoch_start
    state.train_time_s += elapsed
    return {
        "samples": epoch_samples,
        "time_s": elapsed,
        "samples_per_s": epoch_samples / max(elapsed, 1e-9),
        "data_wait_frac": epoch_wait / max(elapsed, 1e-9),
        "wait_s": epoch_wait,
    }
