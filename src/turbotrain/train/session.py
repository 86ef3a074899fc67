"""Run: one training session in its run dir (start or resume, the epoch loop, checkpoints)."""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from turbotrain.compression import prune
from turbotrain.core import checkpoint as ckpt_io
from turbotrain.core.atomic import remove_stale_temps
from turbotrain.data.loader import set_epoch_seed
from turbotrain.models import architecture
from turbotrain.train import collectives as col
from turbotrain.train import distributed as dist
from turbotrain.train import requeue, resume
from turbotrain.train.build import Parts, build
from turbotrain.train.curves import write_curves
from turbotrain.train.ema import ema_state, update_ema
from turbotrain.train.evaluation import evaluate
from turbotrain.train.loop import Diverged, TrainState, train_one_epoch
from turbotrain.train.numerics import platform
from turbotrain.train.preemption import Preempted, StopFlag, requeue_signals, resume_hint
from turbotrain.train.run_dir import forget_run_dir
from turbotrain.train.summary import summary_of
from turbotrain.train.tracking import Tracker, peak_mem_mb, process_age_s, trim_metrics

log = logging.getLogger("turbotrain")


class Run:
    """One training session in its run dir: start (or resume), the epoch loop, checkpoints."""

    def __init__(self, cfg, run_dir: Path, info: dist.DistInfo, device: torch.device, stop: StopFlag, profile_step):
        self.cfg, self.run_dir, self.info, self.device = cfg, run_dir, info, device
        self.stop, self.profile_step = stop, profile_step
        self.ckpt_dir = run_dir / "checkpoints"
        tc = cfg.trainer
        if info.is_main:
            resume.check_run_dir_free(run_dir, tc.resume)  # a fork (another run's checkpoint) needs a free dir
            if stale := remove_stale_temps(self.ckpt_dir):
                log.info("removed %s: partial checkpoint writes of a killed process", ", ".join(stale))
        resume_path = resume.resolve(tc.resume, run_dir)
        ckpt = ckpt_io.load(resume_path) if resume_path is not None else None
        if ckpt is not None:
            resume.check_config(ckpt, cfg, info.world_size, resume_path)
        self.p: Parts = build(cfg, info, device, stop, ckpt, resume_path)
        stop.stop_now("start-up (data, model, autotune, compression)")
        self.state, self.metrics = TrainState(), {}
        if ckpt is not None:
            ckpt_io.restore(ckpt, optimizer=self.p.optimizer, scaler=self.p.precision.scaler)
            resume.continue_schedule(self.p.scheduler, ckpt["scheduler"])
            self.state, self.metrics = TrainState.from_dict(ckpt["state"]), ckpt["metrics"]
            ckpt_io.set_rng_state(ckpt_io.rank_rng(ckpt, info.rank))
            log.info("resumed from %s at epoch %d, step %d", resume_path, self.state.epoch, self.state.global_step)
            saved_lr, lr = ckpt["optimizer"]["param_groups"][0]["lr"], self.p.optimizer.param_groups[0]["lr"]
            log.info("learning rate at the resume step: %.6g in the checkpoint, %.6g on this session's schedule", saved_lr, lr)
            if resume.is_fork(str(resume_path), run_dir):  # not after a restart: that continues the fork's own last.pt
                self.state.parent = str(resume_path)
        if info.is_main and (dropped := trim_metrics(run_dir, self.state.global_step)):
            log.info("metrics.jsonl: dropped %d line(s) written after the checkpoint or cut off by a kill", dropped)
        self.tracker = Tracker(
            run_dir,
            enabled=info.is_main,
            logger_cfg=cfg.logger,
            config=OmegaConf.to_container(cfg, resolve=True),
            progress_bar=tc.progress_bar,
            steps=(self.state.global_step, self.p.loaders.total_steps),
            progress_every_s=tc.progress_every_s,
        )
        self.config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
        self.arch = architecture(cfg, self.p.data, self.p.model)
        self.first_step_s: float | None = None  # process age at the first optimizer step (start-up cost)
        self.session = torch.zeros(3, dtype=torch.float64)  # samples (all ranks), seconds, data-wait seconds
        self.balance: list[list[float]] = []
        # (step, batch in epoch) of the last save, and when: the clock of trainer.checkpoint_every_minutes
        self.saved_at, self.saved_time = (self.state.global_step, self.state.batch_in_epoch), time.monotonic()
        self.bad_agreed = self.state.bad_samples  # all ranks' bad samples as of the last save

    # -- checkpoints and stopping -------------------------------------------------------------

    def save(self, best: bool = False) -> None:
        """Every rank calls this at the same point (the RNG states are gathered); rank 0 writes.
        Non-finite weights or optimizer state are never written: the run stops instead."""
        p, s = self.p, self.state
        self._agree_bad_samples()
        ckpt = ckpt_io.payload(  # every rank builds it (references, no copies): every rank checks it
            state_dict=prune.plain_state_dict(p.model),
            optimizer=p.optimizer,
            scheduler=p.scheduler,
            scaler=p.precision.scaler,
            state=s.as_dict(),
            config_yaml=self.config_yaml,
            arch=self.arch,
            metrics=self.metrics,
            rng=col.gather_objects(ckpt_io.rng_state(), self.info.cpu_group),
            ema=ema_state(p.ema) if p.ema is not None else None,
            data=resume.data_identity(p.data),
            platform=platform(self.device),
        )
        bad = ckpt_io.nonfinite(ckpt)
        if bad:
            raise Diverged(
                s.global_step,
                f"{len(bad)} tensor(s) are not finite after step {s.global_step} (first: {bad[0]}); a finite loss "
                "had non-finite gradients? trainer.nan_check=grads skips such steps",
            )
        self.saved_at, self.saved_time = (s.global_step, s.batch_in_epoch), time.monotonic()
        if not self.info.is_main:
            return
        ckpt_io.write(ckpt, self.ckpt_dir, best=best)

    def _agree_bad_samples(self) -> None:
        """Each rank counts the bad samples of its own shard: at a save (every rank, same point)
        the counts since the last one are summed, so the checkpoint and summary.json hold the run's."""
        s = self.state
        if self.info.enabled:
            since = torch.tensor(s.bad_samples - self.bad_agreed)
            s.bad_samples = self.bad_agreed + int(col.all_reduce_sum(since, self.info.cpu_group))
        self.bad_agreed = s.bad_samples

    def stop_if_asked(self, clock: bool = False) -> bool:
        """Ranks agree on a stop (a signal may reach one rank a step before another): all save at
        the same step and exit 128 + signal. With `clock`, the same agreement says whether
        trainer.checkpoint_every_minutes has passed on any rank since the last save (returned)."""
        minutes = self.cfg.trainer.checkpoint_every_minutes
        due = int(clock and minutes is not None and time.monotonic() - self.saved_time >= 60 * minutes)
        signum = self.stop.signum or 0
        if self.info.enabled:
            signum, due = col.agree_max([signum, due], self.info.cpu_group)
        if not signum:
            return bool(due)
        self.save()
        if self.info.is_main and signum in requeue_signals(self.cfg.trainer.requeue_signals):
            requeue.note_stop(self.ckpt_dir, signum, self.state.global_step)
        raise Preempted(
            signum,
            f"stopped by {signal.Signals(signum).name} at step {self.state.global_step}; checkpoint written to "
            f"{self.ckpt_dir / 'last.pt'}; {resume_hint(self.run_dir)}",
        )

    def on_step(self, s: TrainState) -> None:
        if self.first_step_s is None:
            self.first_step_s = process_age_s()
        if self.profile_step is not None:
            self.profile_step()
        if self.p.ema is not None:
            update_ema(self.p.ema, self.p.model, s.global_step, self.cfg.trainer)
        clock_due = self.stop_if_asked(clock=True)
        every = self.cfg.trainer.checkpoint_every_n_steps
        if clock_due or (every and s.global_step % every == 0):
            self.save()

    # -- the loop ------------------------------------------------------------------------------

    def fit(self) -> float:
        tc, p, state = self.cfg.trainer, self.p, self.state
        self._log_start()
        while state.epoch < tc.max_epochs and not (tc.max_steps and state.global_step >= tc.max_steps):
            stats = self._train_epoch()
            if self.saved_at != (state.global_step, state.batch_in_epoch):
                self.save()  # the epoch's training, before validation can fail or be killed
            epoch_done = state.batch_in_epoch >= p.loaders.batches_in_epoch
            val = self._validate(stats) if self._validation_due(epoch_done) else None
            if val is None:
                self.stop_if_asked()  # what _validate checks, for an epoch without validation
            if epoch_done:
                state.epoch += 1
                state.batch_in_epoch = 0
            improved = val is not None and val["acc1"] > state.best_val_acc1
            if improved:
                state.best_val_acc1 = val["acc1"]
            self.save(best=improved)
        prune.make_permanent(p.model)
        self.tracker.summary(summary_of(self))
        self.tracker.close()
        forget_run_dir()  # rank 0 under torchrun: no restart will continue a finished run
        if self.info.is_main:
            requeue.forget(self.ckpt_dir)  # nor a requeue of this job
            write_curves(self.run_dir)
        return state.best_val_acc1

    def _validation_due(self, epoch_done: bool) -> bool:
        """Every trainer.val_every_n_epochs-th epoch, and always at the run's end (its last epoch,
        or trainer.max_steps reached mid-epoch)."""
        tc, state = self.cfg.trainer, self.state
        ended = (tc.max_steps and state.global_step >= tc.max_steps) or state.epoch + 1 >= tc.max_epochs
        return not epoch_done or ended or (state.epoch + 1) % tc.val_every_n_epochs == 0

    def _train_epoch(self) -> dict:
        tc, p, state, info = self.cfg.trainer, self.p, self.state, self.info
        p.loaders.sampler.set_epoch(state.epoch, start=state.batch_in_epoch * self.cfg.data.batch_size)
        set_epoch_seed(p.loaders.epoch_seed, tc.seed, state.epoch, info.rank)
        stats = train_one_epoch(
            p.train_model,
            p.loaders.train,
            p.optimizer,
            p.scheduler,
            p.precision,
            state,
            trainer_cfg=tc,
            device=self.device,
            tracker=self.tracker,
            batches_in_epoch=p.loaders.batches_in_epoch,
            on_step=self.on_step,
            reduce=col.summer(info),
            on_device=p.on_device,
        )
        self.session += torch.tensor([stats["samples"] * info.world_size, stats["time_s"], stats["wait_s"]])
        self.balance = col.gather_floats([peak_mem_mb(self.device), stats["time_s"]], info.cpu_group)
        warning = col.balance_warning(self.balance, ("peak_mem_mb", "epoch_time_s")) if info.enabled else None
        if warning and info.is_main:
            log.warning(warning)
        return stats

    def _validate(self, stats: dict) -> dict:
        tc, p, state, info = self.cfg.trainer, self.p, self.state, self.info
        reduce = col.summer(info)
        common = {"device": self.device, "precision": p.precision, "max_batches": tc.limit_val_batches, "stop": self.stop}
        common.update(channels_last=tc.channels_last, reduce=reduce, tta=tc.tta)
        # not through DDP: its buffer broadcast in eval is a collective that a rank without a
        # validation batch would never join
        trained = dist.unwrapped(p.train_model)
        col.broadcast_buffers(trained, info)  # every rank scores (and rank 0 saves) rank 0's BatchNorm statistics
        if p.ema is not None:
            col.broadcast_buffers(p.ema.module, info)
        val = evaluate(p.ema.module if p.ema is not None else trained, p.loaders.val, **common)
        if p.ema is not None:  # the trained weights themselves, for comparison
            val["acc1_no_ema"] = evaluate(trained, p.loaders.val, **common)["acc1"]
        self.stop_if_asked()  # validation stops within a batch; the epoch's training is saved
        self.metrics = {f"val_{k}": v for k, v in val.items()}
        sps = stats["samples_per_s"] * info.world_size
        self.tracker.log(
            step=state.global_step,
            epoch=state.epoch,
            split="val",
            **{k: v for k, v in val.items() if k != "samples"},
            lr=p.optimizer.param_groups[0]["lr"],
            samples_per_s=sps,
            data_wait_frac=stats["data_wait_frac"],
            peak_mem_mb=peak_mem_mb(self.device),
        )
        log.info(
            "epoch %d step %d: val loss %.4f acc1 %.4f acc5 %.4f | train %.0f samples/s, data wait %.1f%%",
            *(state.epoch, state.global_step, val["loss"], val["acc1"], val["acc5"], sps),
            100 * stats["data_wait_frac"],
        )
        return val

    def _log_start(self) -> None:
        p, d = self.p, self.p.data
        log.info(
            "model %s: %.2fM params, %s FLOPs/sample; %d train / %d val samples; device %s x%d, precision %s",
            self.cfg.model.name,
            p.params / 1e6,
            f"{p.flops / 1e6:.1f}M" if p.flops else "?",
            len(d.train),
            len(d.val),
            self.device,
            self.info.world_size,
            p.precision.name if p.precision.dtype is None else f"{p.precision.name} ({p.precision.dtype})",
        )
