"""The logger group: where a run's events go besides metrics.jsonl and summary.json. A builder
returns None or an object with log(event), summary(figures) and close()."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from turbotrain.core.registry import Registry
from turbotrain.core.schema import ConfigError, setting

LOGGERS = Registry("logger")


@dataclass
class LoggerConfig:
    """One schema for every logger option: the others ignore the wandb keys."""

    name: str = "none"  # the option (logger=<name>)
    project: str = "turbotrain"  # wandb project
    mode: str = setting("offline", choices=("offline", "online", "disabled"))  # offline: `wandb sync` later
    entity: str | None = None  # wandb entity (team or user)
    tags: list[str] = setting(factory=list)  # wandb tags


def _scalars(event: dict) -> dict:
    """`<split>/<key>` for the numbers of an event (train/loss, val/acc1, ...)."""
    split = event.get("split", "train")
    return {f"{split}/{k}": v for k, v in event.items() if isinstance(v, int | float) and k not in ("step", "time")}


@LOGGERS.register("none", LoggerConfig)
def no_logger(logger_cfg, run_dir: Path, config: dict) -> None:
    return None  # metrics.jsonl, summary.json and the console only


class WandbLogger:
    def __init__(self, run):
        self.run = run

    def log(self, event: dict) -> None:
        self.run.log(_scalars(event), step=event.get("step"))

    def summary(self, figures: dict) -> None:
        self.run.summary.update({k: v for k, v in figures.items() if isinstance(v, int | float)})

    def close(self) -> None:
        self.run.finish()


@LOGGERS.register("wandb", LoggerConfig)
def wandb_run(logger_cfg, run_dir: Path, config: dict) -> WandbLogger:
    import wandb  # imported only when asked for: it adds seconds to start-up

    return WandbLogger(
        wandb.init(
            project=logger_cfg.project,
            entity=logger_cfg.entity,
            mode=logger_cfg.mode,
            dir=str(run_dir),
            config=config,
            tags=list(logger_cfg.tags),
            name=run_dir.name,
        )
    )


class TensorBoardLogger:
    """Event files in <run>/tensorboard/: every number of every event, under the event's step
    and wall time, and the summary's numbers as `summary/<key>` at the last step."""

    def __init__(self, writer):
        self.writer, self.last_step = writer, 0

    def log(self, event: dict) -> None:
        self.last_step = event.get("step", self.last_step)
        for tag, value in _scalars(event).items():
            self.writer.add_scalar(tag, value, global_step=self.last_step, walltime=event.get("time"))

    def summary(self, figures: dict) -> None:
        for key, value in figures.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                self.writer.add_scalar(f"summary/{key}", value, global_step=self.last_step)

    def close(self) -> None:
        self.writer.close()


@LOGGERS.register("tensorboard", LoggerConfig)
def tensorboard(logger_cfg, run_dir: Path, config: dict) -> TensorBoardLogger:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise ConfigError("logger=tensorboard needs the package tensorboard (pip install 'turbotrain[tensorboard]')") from e
    return TensorBoardLogger(SummaryWriter(log_dir=str(run_dir / "tensorboard")))
