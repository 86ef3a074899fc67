"""Starting or continuing a run in its dir: which checkpoint to resume, whether the dir is free,
whether the new config still describes the same training, and the LR schedule of an extended run."""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import warnings
from pathlib import Path

from omegaconf import OmegaConf

from turbotrain.config import TrainerConfig, is_numeric, registries
from turbotrain.core.schema import ConfigError
from turbotrain.train.autotune import apply_choice, choice_from_checkpoint
from turbotrain.train.numerics import keep_saved
from turbotrain.train.requeue import requeued

log = logging.getLogger("turbotrain")


def restarts() -> int:
    """How often the elastic agent has restarted this worker's group (distributed.max_restarts,
    torchrun --max-restarts); a restarted worker continues the run in its dir without being told to."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def continues(run_dir: Path) -> bool:
    """This start continues the run in `run_dir` by itself: a worker restarted by the elastic
    agent, or a job its scheduler requeued after a requeue signal (requeue.py)."""
    return bool(restarts()) or requeued(run_dir)


def is_fork(resume: str | None, run_dir: Path) -> bool:
    """trainer.resume names another run's checkpoint: this run starts a fork of that run."""
    if resume in (None, "auto"):
        return False
    return Path(resume).expanduser().resolve().parent != (Path(run_dir) / "checkpoints").resolve()


def resolve(resume: str | None, run_dir: Path) -> Path | None:
    """The checkpoint to resume from: `auto` is this run dir's last.pt when there is one. A
    restarted worker continues its own run dir's last.pt, a fork's too, once it has one."""
    own = run_dir / "checkpoints" / "last.pt"
    if continues(run_dir) and own.is_file():
        return own
    if not resume and continues(run_dir):
        resume = "auto"
    if not resume:
        return None
    if resume == "auto":
        last = run_dir / "checkpoints" / "last.pt"
        if last.is_file():
            return last
        log.info("trainer.resume=auto: no %s yet, starting fresh", last)
        return None
    return Path(resume).expanduser()


def run_files(run_dir: Path) -> list[str]:
    """What makes a dir hold a run: its checkpoints, metrics or summary (empty: a fresh dir)."""
    return [p.name for p in (run_dir / "checkpoints", run_dir / "metrics.jsonl", run_dir / "summary.json") if p.exists()]


def check_run_dir_free(run_dir: Path, resume: str | None) -> None:
    """A fresh run, or a fork of another run, never writes over a run's checkpoints and metrics."""
    if continues(run_dir) or (resume and not is_fork(resume, run_dir)):
        return
    taken = run_files(run_dir)
    if taken and resume:
        raise ConfigError(
            f"trainer.resume={resume} is another run's checkpoint: continuing it here starts a fork of that run, "
            f"and run dir {run_dir} already holds a run ({', '.join(taken)}): fork into a new dir (hydra.run.dir=...)"
        )
    if taken:
        raise ConfigError(
            f"run dir {run_dir} already holds a run ({', '.join(taken)}): continue it with trainer.resume=auto, "
            "or start a new run in another dir (hydra.run.dir=...)"
        )


def _flat(node, prefix: str = "") -> dict:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: node}


_ABSENT = object()


def _schema(group: str, cfg) -> type | None:
    """The schema of a config section: TrainerConfig, or the selected option's."""
    if group == "trainer":
        return TrainerConfig
    if group in registries() and group in cfg:
        return registries()[group].of(cfg[group]).schema
    return None


def _schema_default(key: str, cfg):
    """The default of `key` in the schema this config uses; _ABSENT for a key no schema has."""
    group, _, rest = key.partition(".")
    schema = _schema(group, cfg)
    return _ABSENT if schema is None else OmegaConf.select(OmegaConf.structured(schema), rest, default=_ABSENT)


def _numeric(key: str, cfg) -> bool:
    """Whether a change of `key` alters what a resumed run computes: its field's `numeric` in the
    schema `cfg` selects, else its group's rule. A key that schema lacks (another option's, which
    Hydra composes as null, or one turbotrain no longer has) alters nothing under it."""
    group, _, rest = key.partition(".")
    schema = _schema(group, cfg)
    if schema is None:
        return False
    field = {f.name: f for f in dataclasses.fields(schema)}.get(rest.split(".")[0])
    if field is None:
        return False
    return is_numeric(group, field)


def changed_keys(saved_yaml: str, cfg) -> list[tuple[str, object, object]]:
    """(key, saved value, new value) for the numeric keys that differ. A key the saved
    config lacks (added to turbotrain after that run) counts as its default: the run trained
    with the behaviour that default keeps."""
    old = _flat(OmegaConf.to_container(OmegaConf.create(saved_yaml), resolve=False))
    new = _flat(OmegaConf.to_container(cfg, resolve=True))
    for key in set(new) - set(old):
        if (default := _schema_default(key, cfg)) is not _ABSENT:
            old[key] = default

    saved = OmegaConf.create(saved_yaml)  # a key of the saved run's option alone (its kernel) has its say too
    keys = sorted(k for k in set(old) | set(new) if _numeric(k, cfg) and _numeric(k, saved))
    return [(k, old.get(k), new.get(k)) for k in keys if old.get(k) != new.get(k)]


def check_config(ckpt: dict, cfg, world_size: int, path: Path) -> None:
    """Refuse to continue with a config that trains differently from the checkpoint's, unless
    trainer.resume_strict=false. Extending the run (max_epochs, max_steps) is always allowed. The
    saved config holds what the first session chose at run time (numerics.AUTO's keys; with
    trainer.autotune, an attention kernel, say): the command as typed is compared with those
    choices applied, so re-running it resumes, and a key typed to another value is a change."""
    cfg = copy.deepcopy(cfg)
    keep_saved(cfg, ckpt)
    if cfg.trainer.autotune:
        apply_choice(cfg, choice_from_checkpoint(ckpt))
    diffs = [f"{k}: {a} -> {b}" for k, a, b in changed_keys(ckpt["config"], cfg)]
    saved_world = ckpt.get("world_size", 1)
    if saved_world != world_size:
        diffs.append(f"world size: {saved_world} -> {world_size}")
    if not diffs:
        return
    message = f"resuming {path} with a config that trains differently ({'; '.join(diffs)})"
    if cfg.trainer.resume_strict:
        raise ConfigError(message + ": restore those values, or set trainer.resume_strict=false to continue anyway")
    log.warning("%s; continuing because trainer.resume_strict=false", message)


def data_identity(data) -> dict:
    """The checkpoint's `data` entry: what a resume compares besides the class names (arch)."""
    return {"train_samples": len(data.train), "class_files": data.class_files}


def check_data(ckpt: dict, data, path: Path, strict: bool) -> None:
    """Refuse to continue on data that is not the run's: other or reordered classes, another
    number of training samples (another epoch order), class folders swapped or renamed (the same
    names, other labels). Old checkpoints without a `data` entry are checked by class names only."""
    saved, problems = ckpt.get("data") or {}, []
    if ckpt["arch"]["class_names"] != data.class_names:
        problems.append(f"classes {ckpt['arch']['class_names']} -> {data.class_names}")
    if saved.get("train_samples") not in (None, len(data.train)):
        problems.append(f"training samples {saved['train_samples']} -> {len(data.train)}")
    if saved.get("class_files") and data.class_files and not problems:
        changed = [c for c in data.class_names if saved["class_files"].get(c) != data.class_files.get(c)]
        if changed:
            problems.append(f"the files of class {', '.join(changed)} changed (class folders swapped or renamed?)")
    if not problems:
        return
    message = f"resuming {path} on other data ({'; '.join(problems)}): its labels or epoch order are not the run's"
    if strict:
        raise ConfigError(message + "; restore the data, or set trainer.resume_strict=false to continue anyway")
    log.warning("%s; continuing because trainer.resume_strict=false", message)


def continue_schedule(scheduler, saved_state: dict | None) -> None:
    """Put a freshly built scheduler (built for this session's horizon) at the checkpoint's step.

    The schedulers here compute the LR in closed form from their step count, so an unchanged
    horizon gives exactly the LR of the uninterrupted run, and an extended run (more epochs or
    steps) gets the LR a run configured with the new length from the start would have at this
    step: cosine rises to that curve and decays to its minimum at the new end, never 0 before it."""
    if scheduler is None or saved_state is None:
        return
    scheduler.last_epoch = saved_state["last_epoch"] - 1
    with warnings.catch_warnings():  # "scheduler.step() before optimizer.step()": not a real step
        warnings.simplefilter("ignore", UserWarning)
        scheduler.step()
