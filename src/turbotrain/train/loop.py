"""train_one_epoch / evaluate as plain functions (export reuses evaluate), and the optimizer step
with its skip rules for non-finite losses and gradients."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from omegaconf import OmegaConf
from torch import nn
from torch.nn import functional as F

from turbotrain.core.modules import forward
from turbotrain.train.meter import Meter, timed_batches
from turbotrain.train.optim import build_optimizer
from turbotrain.train.precision import Precision
from turbotrain.train.tracking import Tracker, gpu_util, peak_mem_mb


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
    parent: str | None = None  # a fork: the checkpoint of another run it started from (trainer.resume=<path>)
    # On the training device, read at log steps: skips since the last read, the current streak and
    # the longest streak since the last read (a host read per step would stall a GPU's queue).
    skips: torch.Tensor | None = field(default=None, repr=False)

    def count_skip(self, skipped: torch.Tensor) -> None:
        """Count one optimizer step, `skipped` 1 or 0 on the device, without reading it."""
        if self.skips is None:
            self.skips = torch.tensor(
                [0.0, self.nan_streak, self.nan_streak],
                device=skipped.device,  # pragma: no mutate (on a CPU every tensor is there: only a GPU run tells)
            )
        total, streak, longest = self.skips.unbind()
        streak = (streak + 1) * skipped
        self.skips = torch.stack([total + skipped, streak, torch.maximum(longest, streak)])

    def read_skips(self) -> int:
        """Fold the device counts into the fields (one host read); the longest streak since the last read."""
        if self.skips is None:
            return self.nan_streak
        total, streak, longest = (int(v) for v in self.skips.tolist())
        self.skipped_steps += total
        self.nan_streak = streak
        self.skips = self.skips.new_tensor([0.0, streak, streak])
        return longest

    @classmethod
    def from_dict(cls, saved: dict) -> TrainState:
        """A checkpoint's state; fields a later turbotrain no longer has are dropped."""
        known = {f.name for f in dataclasses.fields(cls)} - {"skips"}
        return cls(**{k: v for k, v in saved.items() if k in known})

    def as_dict(self) -> dict:
        self.read_skips()
        return {key: value for key, value in vars(self).items() if key != "skips"}  # the counts are in the fields


class Diverged(RuntimeError):
    """The loss stayed non-finite (trainer.on_nan=stop, or nan_patience exhausted), or the weights did."""

    def __init__(self, step: int, reason: str):
        super().__init__(f"{reason} at step {step}")


def to_device(batch, device: torch.device, channels_last: bool = False):
    """(inputs, target) on `device`; a third element (samples dropped as bad) is ignored here."""
    inputs, target = batch[0], batch[1]
    if isinstance(inputs, dict):
        inputs = {k: v.to(device, non_blocking=True) for k, v in inputs.items()}
    else:
        fmt = torch.channels_last if channels_last and inputs.ndim == 4 else torch.preserve_format
        inputs = inputs.to(device, non_blocking=True, memory_format=fmt)
    return inputs, target.to(device, non_blocking=True)


def freeze_bn(model: nn.Module) -> None:
    """BN in eval mode uses and keeps its running statistics: with gradient accumulation
    the statistics stop tracking tiny micro-batches once they are warmed up."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.eval()


def _optimizer_step(model, optimizer, scheduler, precision: Precision, grad_clip: float | None, bad) -> torch.Tensor:
    """Unscale, clip, step, update the scaler, with no host read. Returns 1.0 on the device when
    the step was skipped: `bad` (the group's losses were not finite, agreed across DDP ranks), else
    a non-finite gradient norm (identical on every DDP rank), or the scaler's inf check. The LR
    schedule advances either way: it counts steps taken or skipped, as global_step does."""
    scaler = precision.scaler
    if scaler is not None:
        scaler.unscale_(optimizer)
        if grad_clip:
            nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        scale = scaler._scale.clone()  # get_scale() would read it on the host
        scaler.step(optimizer)
        scaler.update()
        skipped = (scaler._scale < scale).float()  # the scale only drops when grads were inf/NaN
    else:
        if bad is None or grad_clip:
            norm = nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])  # 0 for none
            bad = ~torch.isfinite(norm) if bad is None else bad | ~torch.isfinite(norm)
            if grad_clip:  # a non-finite norm makes the gradients NaN: that step is skipped anyway
                nn.utils.clip_grads_with_norm_(model.parameters(), grad_clip, norm)
        skipped = bad.float()
        step_unless(optimizer, skipped)
    optimizer.zero_grad(set_to_none=True)
    if scheduler is not None:
        scheduler.step()
    return skipped


def step_unless(optimizer: torch.optim.Optimizer, skipped: torch.Tensor) -> None:
    """optimizer.step() unless `skipped`. A fused optimizer takes the flag into its kernel, as it
    takes GradScaler's inf check: nothing is read on the host. Others read it (free on a CPU)."""
    if getattr(optimizer, "_step_supports_amp_scaling", False):
        optimizer.found_inf = skipped
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf
    elif not skipped.item():
        optimizer.step()


@dataclass
class Step:
    """What one optimizer step of train_one_epoch works with, besides the batches."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object
    precision: Precision
    cfg: object  # trainer config
    reduce: Callable[[torch.Tensor], torch.Tensor] | None
    nonfinite: torch.Tensor  # non-finite losses in the current accumulation group (nan_check=loss)

    def __post_init__(self):
        # on_nan=stop: non-finite losses since the run began, and the first one's step and value,
        # kept on the device and read at check(): a read per micro-batch would sync a GPU each time
        self.stop_count = torch.zeros_like(self.nonfinite)
        self.stop_step = torch.full_like(self.nonfinite, -1)
        self.stop_loss = torch.zeros_like(self.nonfinite)

    @property
    def check_loss(self) -> bool:
        # nan_check=loss: a step is skipped when a loss of its group was not finite (free: no pass over
        # the gradients); grads: when the gradient norm is not finite (one more pass, ~5% on resnet18)
        return self.cfg.nan_check == "loss" and self.precision.scaler is None

    def backward(self, inputs, target: torch.Tensor, group_len: int, last_in_group: bool, state: TrainState):
        """Forward and backward of one micro-batch (DDP syncs gradients on the group's last)."""
        sync = contextlib.nullcontext() if last_in_group or not hasattr(self.model, "no_sync") else self.model.no_sync()
        with sync:
            with self.precision.autocast():
                logits = forward(self.model, inputs)
                loss = F.cross_entropy(logits.float(), target, label_smoothing=self.cfg.label_smoothing)
            bad = (~torch.isfinite(loss.detach())).float()
            if self.cfg.on_nan == "stop":
                self._note_for_stop(loss.detach(), bad, state.global_step)
            if self.check_loss:
                self.nonfinite += bad
            scaled = loss / group_len
            (self.precision.scaler.scale(scaled) if self.precision.scaler else scaled).backward()
        return loss, logits

    def _note_for_stop(self, loss: torch.Tensor, bad: torch.Tensor, step: int) -> None:
        first = (bad > 0) & (self.stop_count == 0)
        self.stop_step.copy_(torch.where(first, step, self.stop_step))
        self.stop_loss.copy_(torch.where(first, loss.float(), self.stop_loss))
        self.stop_count += bad

    def step(self, state: TrainState) -> None:
        """The optimizer step that ends an accumulation group, or its skip."""
        bad = None
        if self.check_loss:
            bad = (self.reduce(self.nonfinite) if self.reduce else self.nonfinite) > 0  # ranks skip together
            self.nonfinite.zero_()  # `bad` is its own tensor: the next group counts from zero
        state.count_skip(_optimizer_step(self.model, self.optimizer, self.scheduler, self.precision, self.cfg.grad_clip, bad))
        state.global_step += 1

    def check(self, state: TrainState) -> None:
        """At log steps and the epoch's end, where the loop reads the device anyway. on_nan=stop
        stops here, on every DDP rank: a step whose loss was not finite was skipped (nan_check),
        the steps since were taken, and the weights stay finite."""
        if self.cfg.on_nan == "stop":
            anywhere = self.reduce(self.stop_count.clone()) if self.reduce else self.stop_count
            if anywhere.item():
                here = int(self.stop_step.item())
                where = (
                    (here, f"loss is {self.stop_loss.item()}")
                    if here >= 0
                    else (state.global_step, "another rank's loss was not finite")
                )
                raise Diverged(*where)
        patience = self.cfg.nan_patience
        if state.read_skips() >= patience:
            raise Diverged(state.global_step, f"{patience} consecutive steps skipped for non-finite losses or gradients")


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
    on_device: Callable[[torch.Tensor, torch.Tensor, int], tuple] | None = None,
) -> dict:
    """One pass over `loader` from micro-batch `state.batch_in_epoch` of `batches_in_epoch`. Accumulation
    groups are fixed by position in the epoch, so each group's loss is divided by its own length (the
    last may be short). `on_device` transforms a batch on its device (resolution, mixing)."""
    tc, accum = trainer_cfg, trainer_cfg.grad_accum_steps
    nonfinite = torch.zeros((), device=device)  # pragma: no mutate (a CPU's tensors are all there: a GPU run tells)
    step = Step(model, optimizer, scheduler, precision, tc, reduce, nonfinite)
    meter = Meter(device)  # pragma: no mutate (as nonfinite's device)
    model.train()
    bar = tracker.bar(batches_in_epoch, f"epoch {state.epoch}", done=state.batch_in_epoch)

    def more() -> bool:
        return state.batch_in_epoch < batches_in_epoch and (tc.max_steps is None or state.global_step < tc.max_steps)

    for batch in timed_batches(loader, meter, more):
        group_start = (state.batch_in_epoch // accum) * accum
        group_len = min(accum, batches_in_epoch - group_start)
        last_in_group = state.batch_in_epoch + 1 == group_start + group_len
        if tc.accum_bn == "freeze" and state.global_step >= tc.accum_bn_warmup_steps:
            freeze_bn(model)
        inputs, target = to_device(batch, device, tc.channels_last)
        if on_device is not None:
            inputs, target = on_device(inputs, target, state.global_step)
        state.bad_samples += int(batch[2]) if len(batch) > 2 else 0
        loss, logits = step.backward(inputs, target, group_len, last_in_group, state)
        meter.add(loss, logits, target)
        state.batch_in_epoch += 1
        state.samples_seen += len(target)
        bar.update(1)
        if not last_in_group:
            continue
        step.step(state)
        if state.global_step % tc.log_every_n_steps == 0:
            step.check(state)
            event = {"step": state.global_step, "epoch": state.epoch, "split": "train", **meter.interval_event(reduce)}
            event.update(lr=optimizer.param_groups[0]["lr"], peak_mem_mb=peak_mem_mb(device), gpu_util=gpu_util(device))
            tracker.log(**event, skipped_steps=state.skipped_steps)
            bar.set_postfix(loss=f"{event['loss']:.3f}", acc=f"{event['acc1']:.3f}", sps=f"{event['samples_per_s']:.0f}")
        if on_step is not None:
            on_step(state)
    bar.close()
    step.check(state)
    stats = meter.epoch_stats()
    state.train_time_s += stats["time_s"]
    return stats


def short_run(model: nn.Module, loader, cfg, *, device: torch.device, precision: Precision, batches: int, on_step, **trainer):
    """A few training steps outside the run (autotune trials, fine-tuning between pruning steps):
    their own optimizer, no LR schedule, nothing logged. `trainer` overrides trainer.* keys."""
    tc = OmegaConf.merge(cfg.trainer, {"max_steps": None, **trainer})
    tracker = Tracker(".", enabled=False, logger_cfg=cfg.logger, config={})
    optimizer = build_optimizer(model, cfg.optim)
    train_one_epoch(
        model,
        loader,
        optimizer,
        None,
        precision,
        TrainState(),
        trainer_cfg=tc,
        device=device,  # pragma: no mutate (None moves no batch: only a GPU run, gpu_check's autotune, tells)
        tracker=tracker,
        batches_in_epoch=batches,
        on_step=on_step,
    )
