"""The running figures of a training epoch (loss, accuracy, throughput, data wait) and the
batch iterator that times the wait for data."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def topk_correct(logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    k = min(5, logits.shape[-1])
    top = logits.topk(k, dim=-1).indices
    hit = top.eq(target.unsqueeze(-1))
    return hit[:, 0].sum(), hit.any(-1).sum()


class Meter:
    """Running figures of one epoch: the loss/accuracy of the current log interval (summed on the
    device: no sync per step), samples, and time spent waiting for data."""

    def __init__(self, device: torch.device):
        self.interval = torch.zeros(2, device=device)  # loss sum, correct1 (the count is on the host)
        self.start = self.interval_start = time.perf_counter()
        self.wait_s = self.interval_wait_s = 0.0
        self.samples = self.interval_samples = 0

    def waited(self, seconds: float) -> None:
        self.wait_s += seconds
        self.interval_wait_s += seconds

    def add(self, loss: torch.Tensor, logits: torch.Tensor, target: torch.Tensor) -> None:
        n = len(target)
        hard = target.argmax(-1) if target.ndim > 1 else target  # mixed batches: the larger share's class
        correct1 = topk_correct(logits.detach(), hard)[0].float()
        self.interval += torch.stack([loss.detach() * n, correct1])  # no host-to-device copy per step
        self.samples += n
        self.interval_samples += n

    def interval_event(self, reduce) -> dict:
        """The train event of the interval that ends now; starts the next one. Every rank calls
        this at the same step, so the sum across ranks cannot deadlock."""
        sums = torch.cat([self.interval, self.interval.new_tensor([self.interval_samples])])  # one copy per interval
        loss_sum, correct, count = (reduce(sums) if reduce else sums).tolist()
        elapsed = time.perf_counter() - self.interval_start
        event = {
            "loss": loss_sum / count,
            "acc1": correct / count,
            "samples_per_s": self.interval_samples / elapsed,
            "data_wait_frac": self.interval_wait_s / elapsed,
        }
        self.interval.zero_()
        self.interval_start, self.interval_wait_s, self.interval_samples = time.perf_counter(), 0.0, 0
        return event

    def epoch_stats(self) -> dict:
        elapsed = time.perf_counter() - self.start
        return {
            "samples": self.samples,
            "time_s": elapsed,
            "samples_per_s": self.samples / max(elapsed, 1e-9),
            "data_wait_frac": self.wait_s / max(elapsed, 1e-9),
            "wait_s": self.wait_s,
        }


def timed_batches(loader, meter: Meter, more: Callable[[], bool]):
    """The loader's batches while `more()` (asked before each fetch: a batch drawn is randomness
    spent), with the wait for each counted as data wait."""
    it = iter(loader)
    while more():
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            return
        meter.waited(time.perf_counter() - t0)
        yield batch
