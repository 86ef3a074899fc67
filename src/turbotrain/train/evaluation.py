"""Validation: loss, top-1 and top-5 of a model over a loader, sharded across ranks, with
test-time augmentation when trainer.tta asks for it."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from turbotrain.core.modules import eval_mode, forward
from turbotrain.train.loop import to_device
from turbotrain.train.meter import topk_correct
from turbotrain.train.precision import Precision
from turbotrain.train.preemption import StopFlag
from turbotrain.train.tta import extra_views, mean_log_softmax


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
    stop: StopFlag | None = None,
    tta: str = "none",
) -> dict:
    """Loss/top-1/top-5 over the loader; with `tta` (trainer.tta) of the views' mean softmax,
    and `acc1_no_tta` of the batch alone. `reduce` (e.g. an all_reduce) sums the totals across
    processes before they become means."""
    sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss, correct1, correct5, correct1 without tta
    count = 0  # samples, on the host: no host-to-device copy per batch
    with eval_mode(model):
        for i, batch in enumerate(loader):
            if (max_batches is not None and i >= max_batches) or (stop is not None and stop.signum is not None):
                break  # a stop request: the caller discards these partial figures
            inputs, target = to_device(batch, device, channels_last)
            with precision.autocast():
                logits = forward(model, inputs)
                views = [logits, *(forward(model, v) for v in extra_views(tta, inputs))]
            plain1, _ = topk_correct(logits, target)
            if len(views) > 1:
                scores = mean_log_softmax(views)
                loss = F.nll_loss(scores, target, reduction="sum")
            else:
                scores, loss = logits, F.cross_entropy(logits.float(), target, reduction="sum")
            c1, c5 = topk_correct(scores, target)
            sums += torch.stack([loss.double(), c1.double(), c5.double(), plain1.double()])
            count += len(target)
    sums = torch.cat([sums, sums.new_tensor([count])])  # n last: one copy per evaluation
    if reduce is not None:
        sums = reduce(sums)
    loss, c1, c5, plain1, n = sums.tolist()
    out = {"loss": loss / max(n, 1), "acc1": c1 / max(n, 1), "acc5": c5 / max(n, 1), "samples": int(n)}
    if tta != "none":
        out["acc1_no_tta"] = plain1 / max(n, 1)
    return out
