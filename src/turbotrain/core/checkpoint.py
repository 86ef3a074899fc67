"""Checkpoints: plain dicts of tensors/numbers/strings, written atomically, loaded weights_only.

Layout (format 1):
  model, optimizer, scheduler, scaler   state_dicts (scheduler/scaler may be None)
  state   {epoch, global_step, batch_in_epoch, best_val_acc1, skipped_steps, samples_seen}
  rng     {torch, cuda, numpy, python} of rank 0; rng_ranks: one per rank; world_size
  config  the run's resolved config as a YAML string
  arch    what export/resume need to rebuild the model: {model, num_classes, in_channels,
          image_size, mean, std, class_names}
  metrics last validation metrics
  data    what a resume compares with its data: {train_samples, class_files (image folders: a
          digest of each class's file names)}
  ema     None, or the averaged weights (trainer.ema_decay): {weights: state_dict, updates}; what
          export and compression.from_run take, and what the metrics describe
  platform what picks the kernels besides the config: {cpu_vendor, cpu_capability, cpu_isa,
          isa_caps, device, torch} (train/numerics.py); a resume elsewhere says it is not exact
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from turbotrain.core import checkpoint_trust
from turbotrain.core.atomic import atomic_write, atomic_write_link
from turbotrain.core.errors import UserError

FORMAT = 1


class CheckpointError(UserError, RuntimeError):
    """A checkpoint is missing, unreadable or does not fit the model."""


def atomic_save(obj: Any, path: str | Path) -> None:
    """torch.save through `atomic_write`: a crash or a full disk leaves the previous file intact."""
    atomic_write(path, lambda f: torch.save(obj, f))


def load(path: str | Path, map_location: str | torch.device = "cpu") -> dict:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        detail = str(e).split("WeightsUnpickler error:")[-1].strip().splitlines()[0]  # torch's advice is pages long
        raise CheckpointError(f"checkpoint {path} is unreadable or corrupt ({type(e).__name__}: {detail})") from e
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT or "model" not in ckpt:
        raise CheckpointError(f"checkpoint {path} is not a turbotrain checkpoint (format {FORMAT})")
    try:
        checkpoint_trust.check(ckpt)
    except checkpoint_trust.UntrustedCheckpoint as e:
        raise CheckpointError(f"checkpoint {path} is refused: {e}") from e
    return ckpt


def rng_state() -> dict:
    np_state = np.random.get_state()
    # this rank's device. The CUDA lines here and in set_rng_state run only on a GPU, which the
    # CPU suite has not: mutation testing leaves them out (bench/gpu_check.sh's requeue runs them)
    cuda = [torch.cuda.get_rng_state()] if torch.cuda.is_available() else []  # pragma: no mutate
    return {
        "torch": torch.get_rng_state(),
        "cuda": cuda,
        "numpy": {
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "python": [list(random.getstate()[1]), random.getstate()[0]],
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    cuda = state["cuda"]  # pragma: no mutate
    if cuda and torch.cuda.is_available():  # pragma: no mutate (older checkpoints held every visible device)
        torch.cuda.set_rng_state(cuda[min(torch.cuda.current_device(), len(cuda) - 1)])  # pragma: no mutate
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    internal, version = state["python"]
    random.setstate((version, tuple(internal), None))


def load_model_state(model: torch.nn.Module, state_dict: dict, path: str | Path) -> None:
    """load_state_dict with a one-line error when the checkpoint is for another architecture."""
    try:
        model.load_state_dict(state_dict)
    except RuntimeError as e:
        first = str(e).strip().splitlines()
        detail = " ".join(line.strip() for line in first[:3])
        raise CheckpointError(
            f"checkpoint {path} does not fit the configured model (different model or num_classes?): {detail}"
        ) from e


def payload(
    *,
    state_dict,
    optimizer,
    scheduler,
    scaler,
    state: dict,
    config_yaml: str,
    arch: dict,
    metrics: dict,
    rng: list[dict],
    ema: dict | None = None,
    data: dict | None = None,
    platform: dict | None = None,
) -> dict:
    """The checkpoint dict (format 1) for the current training state. `rng`: every rank's RNG
    state in rank order (one entry without DDP)."""
    return {
        "format": FORMAT,
        "model": state_dict,
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "state": state,
        "rng": rng[0],
        "rng_ranks": rng,
        "world_size": len(rng),
        "config": config_yaml,
        "arch": arch,
        "metrics": metrics,
        "ema": ema,
        "data": data,
        "platform": platform,
    }


def rank_rng(ckpt: dict, rank: int) -> dict:
    """This rank's saved RNG state (rank 0's for checkpoints from before per-rank states)."""
    ranks = ckpt.get("rng_ranks") or [ckpt["rng"]]
    return ranks[rank] if rank < len(ranks) else ranks[0]


def nonfinite(ckpt: dict) -> list[str]:
    """Names of the model and optimizer tensors holding NaN or inf: such a checkpoint is never written."""
    tensors = [(f"model.{k}", v) for k, v in ckpt["model"].items()]
    if ckpt.get("ema"):
        tensors += [(f"ema.weights.{k}", v) for k, v in ckpt["ema"]["weights"].items()]
    for pid, slots in ckpt["optimizer"]["state"].items():
        tensors += [(f"optimizer.state.{pid}.{k}", v) for k, v in slots.items() if isinstance(v, torch.Tensor)]
    return [name for name, t in tensors if t.is_floating_point() and not bool(torch.isfinite(t).all())]


def write(ckpt: dict, directory: Path, best: bool) -> None:
    """last.pt, and best.pt when `best`. best.pt is written first and last.pt becomes a hard link
    of it: a kill between the two leaves last.pt older, and the resumed run, which repeats that
    validation, rewrites both; best.pt is never older than the metrics say."""
    last = directory / "last.pt"
    if not best:
        atomic_save(ckpt, last)
        return
    atomic_save(ckpt, directory / "best.pt")
    try:
        atomic_write_link(directory / "best.pt", last)
    except OSError:  # a filesystem without hard links: a second write
        atomic_save(ckpt, last)


def restore(ckpt: dict, *, optimizer, scaler) -> None:
    """Load optimizer/scaler states (the model is loaded when it is built; the scheduler is put at
    the saved step by resume.continue_schedule). The kernel (`fused`, `foreach`) stays the one the
    optimizer was built with: the effective config's, where a resume has kept the run's."""
    kernels = [{k: g[k] for k in ("fused", "foreach") if k in g} for g in optimizer.param_groups]
    optimizer.load_state_dict(ckpt["optimizer"])
    for group, kernel in zip(optimizer.param_groups, kernels, strict=True):
        group.update(kernel)
    if scaler is not None and ckpt["scaler"] is not None:
        scaler.load_state_dict(ckpt["scaler"])
