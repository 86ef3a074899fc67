"""Config schemas registered in Hydra's ConfigStore.

`conf/train.yaml` starts its defaults list with `train_schema`, so every group
option is merged onto these dataclasses: a misspelt key or a wrong type fails
at compose time with Hydra's own message. Values whose allowed set is closed
(names of options) are checked by `validation.validate`, which names the key
and the allowed values in one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class DataConfig:
    name: str = MISSING
    root: str | None = None
    cache_dir: str = "~/.cache/turbotrain"
    download: bool = True
    batch_size: int = 128
    eval_batch_size: int | None = None
    image_size: int | None = None  # None: the dataset's native size
    resolution: str = "fixed"  # fixed | dynamic | progressive (training only; eval stays nominal)
    resolution_scale: list[float] = field(default_factory=lambda: [0.8, 1.2])  # dynamic: random scale range
    resolution_step: int = 32  # sizes are multiples of this
    progressive_start: float = 0.5  # progressive: scale until progressive_from of training,
    progressive_from: float = 0.5  # then a linear ramp,
    progressive_until: float = 0.8  # reaching full size at this fraction of training
    on_bad_sample: str = "skip"  # skip (count + warn, naming files) | error
    max_image_pixels: int | None = 89_478_485  # PIL's limit: larger declared sizes are bad samples (null: no limit)
    augment: list[Any] = field(default_factory=list)
    mean: list[float] | None = None
    std: list[float] | None = None
    # synthetic / digits
    num_samples: int = 1024
    num_classes: int = 10
    channels: int = 3
    val_fraction: float = 0.2
    # text
    max_length: int = 128
    bucket_by_length: bool = False  # batches of similar-length texts (less padding); order still seeded
    train_path: str | None = None  # text_files
    val_path: str | None = None
    text_column: str = "text"
    label_column: str = "label"
    hub_name: str | None = None  # hf_hub


@dataclass
class ModelConfig:
    name: str = MISSING
    pretrained: bool = False
    path: str | None = None  # hf: hub name or local folder
    width: int = 32  # small_cnn
    dropout: float | None = None  # None: the architecture's default


@dataclass
class PrecisionConfig:
    name: str = "fp32"
    init_scale: float = 65536.0
    growth_interval: int = 2000
    tf32: bool = False


@dataclass
class AttentionConfig:
    name: str = "full"  # full | sliding_window (transformer models; no-op for CNNs)
    implementation: str = "sdpa"  # full attention kernel: sdpa | eager
    window: int = 256  # sliding_window: tokens each side
    block: int | None = None  # sliding_window query block (None: window; measured fastest at 2048 tokens)
    global_tokens: int = 1  # sliding_window: leading tokens ([CLS]) that attend and are attended globally
    checkpointing: bool = False  # gradient checkpointing of encoder layers
    dropout: float | None = None  # attention dropout; None: the model's (0 lets SDPA use its fused kernel)


@dataclass
class CompressionConfig:
    name: str = "none"
    from_run: str | None = None  # start from this run's best.pt (the initial training phase)
    # channel_prune
    flops_reduction: float | None = None  # e.g. 0.4: MACs drop by 40%
    channel_ratio: float | None = None  # alternative target: fraction of channels removed
    importance: str = "l1"  # l1 | group_l1 | taylor
    round_to: int = 8  # keep pruned channel counts multiples of this (0: exact counts)
    steps: int = 1  # iterative pruning increments
    finetune_steps: int = 0  # optimizer steps of fine-tuning between increments
    # weight_prune
    sparsity: float = 0.5
    # embed_lowrank
    targets: str = "embedding"  # embedding | linear | both
    rank: int | None = None
    energy: float | None = None  # alternative: smallest rank keeping this share of squared singular values


@dataclass
class DistributedConfig:
    name: str = "none"
    nproc: int = 1  # workers this process launches (ignored under torchrun)
    backend: str = "auto"  # auto: nccl on CUDA, gloo on CPU
    timeout_s: int = 1800  # a collective waiting longer than this fails the run
    sync_bn: bool = False
    max_restarts: int = 0  # a failed worker restarts the group this often; restarted workers resume from last.pt


@dataclass
class DeployConfig:
    name: str = "int8"
    calibration_batches: int = 32
    val_batches: int | None = None
    latency_repeats: int = 30
    threads: int | None = None
    autotune: bool = False  # time each setting in autotune_knobs for a few steps, keep the fastest
    autotune_knobs: list[str] = field(default_factory=lambda: ["channels_last", "compile", "num_workers", "attention"])
    autotune_steps: int = 8  # timed steps per setting (after 2 warm-up steps)


@dataclass
class OptimConfig:
    name: str = "sgd"
    lr: float = 0.1
    weight_decay: float = 0.0
    momentum: float = 0.9
    nesterov: bool = False
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    alpha: float = 0.99


@dataclass
class SchedConfig:
    name: str = "none"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0
    max_lr: float | None = None  # cyclic; defaults to optim.lr
    base_lr_ratio: float = 0.1  # cyclic: base_lr = lr * ratio
    cycle_epochs: float = 2.0  # cyclic: one up+down cycle
    pct_start: float = 0.3  # onecycle
    step_epochs: int = 1  # step: decay every N epochs
    gamma: float = 0.1


@dataclass
class LoaderConfig:
    name: str = "default"
    num_workers: int = 0
    auto_workers: bool = False  # time training steps with each of auto_candidates at start, keep the fastest
    auto_candidates: list[int] = field(default_factory=lambda: [0, 1, 2, 4])
    pin_memory: bool | None = None  # None: when training on CUDA
    persistent_workers: bool = True
    prefetch_factor: int | None = None


@dataclass
class LoggerConfig:
    name: str = "none"
    project: str = "turbotrain"
    mode: str = "offline"
    entity: str | None = None
    tags: list[str] = field(default_factory=list)


@dataclass
class ProfilerConfig:
    name: str = "none"  # none | torch
    wait: int = 5
    warmup: int = 2
    active: int = 5
    record_shapes: bool = False
    profile_memory: bool = True


@dataclass
class TrainerConfig:
    device: str = "auto"
    max_epochs: int = 3
    max_steps: int | None = None
    limit_train_batches: int | None = None
    limit_val_batches: int | None = None
    log_every_n_steps: int = 50
    checkpoint_every_n_steps: int | None = None
    grad_accum_steps: int = 1
    accum_bn: str = "none"  # none | freeze
    accum_bn_warmup_steps: int = 100
    grad_clip: float | None = None
    seed: int = 0
    compile: bool = False
    channels_last: bool = False
    resume: str | None = None  # path | auto
    resume_strict: bool = True  # refuse to resume with a config that trains differently (max_epochs/max_steps may grow)
    progress_bar: bool = True
    on_nan: str = "skip"  # non-finite loss: skip the step | stop the run
    nan_patience: int = 20  # consecutive skipped steps before the run counts as diverged
    nan_check: str = "loss"  # what on_nan=skip checks: the losses (free) | the gradient norm (one more pass)
    threads: int | None = None
    autotune: bool = False  # time each setting in autotune_knobs for a few steps, keep the fastest
    autotune_knobs: list[str] = field(default_factory=lambda: ["channels_last", "compile", "num_workers", "attention"])
    autotune_steps: int = 8  # timed steps per setting (after 2 warm-up steps)


@dataclass
class TrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    compression: CompressionConfig = field(default_factory=CompressionConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    deploy: DeployConfig = field(default_factory=DeployConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sched: SchedConfig = field(default_factory=SchedConfig)
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


@dataclass
class ExportConfig:
    deploy: DeployConfig = field(default_factory=DeployConfig)
    run: str | None = None  # run dir; None: the newest run under outputs_dir
    outputs_dir: str = "outputs"
    checkpoint: str = "best"  # best | last
    device: str = "cpu"


def check_group_options(argv: list[str], conf_dir: Path) -> str | None:
    """Hydra answers an unknown `group=option` with a dozen lines (options and search path); this
    says it in one, before Hydra starts. Returns the message, or None when every option exists."""
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        group = conf_dir / key
        if not sep or "/" in key or not group.is_dir() or "," in value or value in ("", "null"):
            continue
        if not (group / f"{value}.yaml").is_file():
            allowed = ", ".join(sorted(f.stem for f in group.glob("*.yaml")))
            return f"{key}={value} is not an option of the {key} group; allowed: {allowed}"
    return None


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="export_schema", node=ExportConfig)


class ConfigError(ValueError):
    """A config value is outside what the pipeline supports; the message names the key."""
