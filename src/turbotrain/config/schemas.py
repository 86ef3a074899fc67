"""Config schemas registered in Hydra's ConfigStore.

`conf/train.yaml` starts its defaults list with `train_schema` (the trainer keys and the groups),
and each option file starts with its own schema from the option's registry, so a misspelt key or a
wrong type fails at compose time with Hydra's own message. Allowed values and bounds sit on the
schema fields; `validation.validate` checks them and names the key in one line.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from turbotrain.core.registry import REGISTRIES
from turbotrain.core.schema import NON_NEGATIVE, POSITIVE, UNIT_HALF_OPEN, UNIT_OPEN, ConfigError, setting

__all__ = ["ConfigError", "ExportConfig", "TrainConfig", "TrainerConfig", "register_configs"]


REQUEUE_SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGHUP", "SIGXCPU")  # trainer.requeue_signals may list these
KNOBS = ("channels_last", "compile", "num_workers", "attention")  # trainer.autotune_knobs: settings that leave the numerics alone
# settings that change the model's function: tuned only when trainer.autotune_knobs lists them.
# attention_kernel: an attention option with the `approximates` trait (sliding_window) or the one it approximates (full)
NUMERICS_KNOBS = ("attention_kernel",)
TTA_CHOICES = ("none", "flip", "flip_shift")  # trainer.tta; train/tta.py holds each one's views


@dataclass
class TrainerConfig:
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    max_epochs: int = setting(3, bound=POSITIVE)  # epochs to train (a resume may raise it)
    max_steps: int | None = setting(None, bound=POSITIVE)  # stop after this many optimizer steps; null: max_epochs decides
    # train on this many batches per epoch; null: all
    limit_train_batches: int | None = setting(None, bound=POSITIVE, numeric=True)
    limit_val_batches: int | None = setting(None, bound=POSITIVE)  # validate on this many batches; null: all
    log_every_n_steps: int = setting(50, bound=POSITIVE)  # optimizer steps between two train events in metrics.jsonl
    val_every_n_epochs: int = setting(1, bound=POSITIVE)  # and always at the run's end
    checkpoint_every_n_steps: int | None = setting(None, bound=POSITIVE)  # also write last.pt every this many optimizer steps
    # last.pt at the first step after this many minutes since the last save (a kill -9, a lost node
    # or an OOM then loses at most that much); ranks agree on the step
    checkpoint_every_minutes: float | None = setting(None, bound=POSITIVE)
    grad_accum_steps: int = setting(1, bound=POSITIVE, numeric=True)  # micro-batches per optimizer step (DDP syncs on the last)
    # with grad_accum_steps > 1: freeze BatchNorm's statistics after accum_bn_warmup_steps
    accum_bn: str = setting("none", choices=("none", "freeze"), numeric=True)
    # optimizer steps before accum_bn=freeze takes effect
    accum_bn_warmup_steps: int = setting(100, bound=NON_NEGATIVE, numeric=True)
    grad_clip: float | None = setting(None, bound=POSITIVE, numeric=True)  # clip the gradients' total norm to this; null: off
    seed: int = setting(0, bound=NON_NEGATIVE, numeric=True)  # seeds Python, NumPy and torch, the data order and the augmentation
    compile: bool = False  # torch.compile the model (pays on long runs; its first steps compile)
    channels_last: bool = True  # images in channels-last memory format (faster convolutions on most CPUs and GPUs)
    resume: str | None = None  # path | auto
    resume_strict: bool = True  # refuse to resume with a config that trains differently (max_epochs/max_steps may grow)
    progress_bar: bool = True  # a bar on a terminal; where stdout is not one, a plain line every progress_every_s
    progress_every_s: float = setting(30.0, bound=NON_NEGATIVE)  # seconds between two plain progress lines off a terminal
    # a scheduler's warning before the time limit (sbatch --signal=USR2@120; submitit: USR2): stop
    # as on SIGTERM, write last.pt, and have the job requeued; its rerun continues the run
    requeue_signals: list[str] = setting(factory=lambda: ["SIGUSR1", "SIGUSR2"], choices=REQUEUE_SIGNALS)
    on_nan: str = setting("skip", choices=("skip", "stop"))  # non-finite loss: skip the step | stop the run
    nan_patience: int = setting(20, bound=POSITIVE)  # consecutive skipped steps before the run counts as diverged
    nan_check: str = setting("loss", choices=("loss", "grads"))  # what on_nan=skip checks: losses (free) | gradient norm
    # intra-op threads; null: torch's count, resolved at start and kept by a resume (reductions split by it)
    threads: int | None = setting(None, bound=POSITIVE, numeric=True)
    # CUDA: deterministic kernels (cuDNN, cuBLAS, torch's own), needed for a bit-exact resume on a GPU; slower
    deterministic: bool = False
    malloc: str = setting("retain", choices=("retain", "system"))  # retain: freed memory stays for the next step (allocator.py)
    autotune: bool = False  # time each setting in autotune_knobs for a few steps, keep the fastest
    # default: the settings that leave the numerics alone; attention_kernel (may swap sliding_window for full) only when listed
    autotune_knobs: list[str] = setting(factory=lambda: list(KNOBS))
    autotune_steps: int = setting(8, bound=POSITIVE)  # timed steps per setting (after 2 warm-up steps)
    # training loss only; validation reports plain cross-entropy
    label_smoothing: float = setting(0.0, bound=UNIT_HALF_OPEN, numeric=True)
    # validation: flip averages the softmax of the batch and its mirror image; flip_shift adds both
    # shifted one pixel up-left and down-right (6 views)
    tta: str = setting("none", choices=TTA_CHOICES)
    # weight averaging: validation, best.pt and export use the averaged weights; null = off
    ema_decay: float | None = setting(None, bound=UNIT_OPEN, numeric=True)
    ema_every_n_steps: int = setting(1, bound=POSITIVE, numeric=True)  # optimizer steps between two updates of the average
    ema_warmup_steps: int = setting(0, bound=NON_NEGATIVE, numeric=True)  # the average copies the weights until then


@dataclass
class TrainConfig:
    # Each group's schema is its selected option's (conf/<group>/<option>.yaml names it first).
    data: Any = MISSING
    model: Any = MISSING
    precision: Any = MISSING
    attention: Any = MISSING
    compression: Any = MISSING
    distributed: Any = MISSING
    deploy: Any = MISSING
    optim: Any = MISSING
    sched: Any = MISSING
    loader: Any = MISSING
    logger: Any = MISSING
    profiler: Any = MISSING
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


@dataclass
class ExportConfig:
    deploy: Any = MISSING
    run: str | None = None  # run dir; None: the newest run under outputs_dir
    outputs_dir: str = "outputs"
    checkpoint: str = "best"  # best | last
    device: str = "cpu"


# Option groups whose keys alter what a resumed run computes, unless a key's schema field says
# `numeric=False` (where the data lives, a kernel that gives the same numbers); the trainer's keys
# alter nothing unless theirs says `numeric=True`; the other groups (logger, loader, ...) nothing.
NUMERIC_GROUPS = ("model", "data", "optim", "sched", "precision", "compression", "attention")


def is_numeric(group: str, field: dataclasses.Field) -> bool:
    """Whether changing this field of `group` alters what a resumed run computes (so a resume refuses it)."""
    flag = field.metadata.get("numeric")
    return flag if flag is not None else group in NUMERIC_GROUPS


def registries() -> dict:
    """Every config group's registry (filled once turbotrain.options is imported)."""
    return REGISTRIES


def options_help(*groups: str) -> str:
    """The `--help` list of config groups (every one, or `groups`) and their options, from the
    registries: `${turbotrain_options:}` or `${turbotrain_options:deploy}` in a help template."""
    lines = [f"{group}: {', '.join(registries()[group].described(mark_text=True))}" for group in sorted(groups or registries())]
    if not groups:
        lines.append("experiment, hparams_search: presets that set several groups (conf/experiment/, conf/hparams_search/)")
    return "\n".join(lines)


def register_configs() -> None:
    """The top-level schemas, and each option's schema as `schema/<group>/<option>`, which the
    option's YAML file names first in its defaults list."""
    if not OmegaConf.has_resolver("turbotrain_options"):
        OmegaConf.register_new_resolver("turbotrain_options", options_help)
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="export_schema", node=ExportConfig)
    for group, registry in registries().items():
        for option in registry:
            cs.store(group=f"schema/{group}", name=option.name, node=registry.composed_schema(option))
