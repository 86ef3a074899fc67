"""Weight averaging (trainer.ema_decay): an exponential moving average of the model, kept by
torch's AveragedModel, updated every `ema_every_n_steps` optimizer steps after
`ema_warmup_steps` (until then it copies the weights). BatchNorm's running statistics are
averaged with the same decay as the weights (`use_buffers=True`), so the averaged model needs
no extra pass over the data (`update_bn`) before it is evaluated. Validation, best.pt's
selection and export use the averaged weights; checkpoints keep both."""

from __future__ import annotations

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from turbotrain.compression.prune import plain_state_dict


def build_ema(model: nn.Module, trainer_cfg) -> AveragedModel | None:
    """The average of `model` (the plain one: not compiled, not DDP-wrapped), or None when off."""
    if trainer_cfg.ema_decay is None:
        return None
    return AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(trainer_cfg.ema_decay), use_buffers=True)


@torch.no_grad()
def update_ema(ema: AveragedModel, model: nn.Module, step: int, trainer_cfg) -> None:
    """After optimizer step `step` (counted from 1). DDP ranks hold the same weights after a step
    but their own BatchNorm statistics: the averages' buffers differ until validation makes them
    rank 0's (collectives.broadcast_buffers), the ones best.pt and last.pt keep."""
    if step % trainer_cfg.ema_every_n_steps:
        return
    if step <= trainer_cfg.ema_warmup_steps:
        ema.n_averaged.zero_()  # AveragedModel copies the weights on an update from zero
    ema.update_parameters(model)


def ema_state(ema: AveragedModel) -> dict:
    """The checkpoint's `ema` entry: the averaged weights under the model's own keys."""
    return {"weights": plain_state_dict(ema.module), "updates": int(ema.n_averaged)}


def load_ema(ema: AveragedModel, state: dict) -> None:
    ema.module.load_state_dict(state["weights"])
    ema.n_averaged.fill_(state["updates"])
