"""Checkpoints: plain dicts of tensors/numbers/strings, written atomically, loaded weights_only.

Layout (format 1):
  model, optimizer, scheduler, scaler   state_dicts (scheduler/scaler may be None)
  state   {epoch, global_step, batch_in_epoch, best_val_acc1, skipped_steps, samples_seen}
  rng     {torch, cuda, numpy, python}
  config  the run's resolved config as a YAML string
  arch    what export/resume need to rebuild the model: {model, num_classes, in_channels,
          image_size, mean, std, class_names}
  metrics last validation metrics
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT = 1


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable or does not fit the model."""


def atomic_save(obj: Any, path: str | Path) -> None:
    """Write to a temp file in the same dir, fsync, then os.replace: readers never see a
    partial file under the final name, and a crash leaves the previous file intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def remove_stale_temps(directory: str | Path) -> list[str]:
    """Delete the temp files of `atomic_save`s whose writer was killed mid-write (kill -9 skips
    the cleanup). Call before this run writes anything into `directory`; returns their names."""
    stale = sorted(Path(directory).glob(".*.tmp*")) if Path(directory).is_dir() else []
    for tmp in stale:
        tmp.unlink(missing_ok=True)
    return [t.name for t in stale]


def atomic_write_text(path: str | Path, text: str) -> None:
    """The same guarantee for small text files (summary, report, run-dir handshake)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


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
    return ckpt


def rng_state() -> dict:
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
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
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
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


def payload(*, state_dict, optimizer, scheduler, scaler, state: dict, config_yaml: str, arch: dict, metrics: dict) -> dict:
    """The checkpoint dict (format 1) for the current training state."""
    return {
        "format": FORMAT,
        "model": state_dict,
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "state": state,
        "rng": rng_state(),
        "config": config_yaml,
        "arch": arch,
        "metrics": metrics,
    }


def restore(ckpt: dict, *, optimizer, scheduler, scaler) -> None:
    """Load optimizer/scheduler/scaler states (the model is loaded when it is built)."""
    optimizer.load_state_dict(ckpt["optimizer"])
    if scheduler is not None and ckpt["scheduler"] is not None:
        scheduler.load_state_dict(ckpt["scheduler"])
    if scaler is not None and ckpt["scaler"] is not None:
        scaler.load_state_dict(ckpt["scaler"])
