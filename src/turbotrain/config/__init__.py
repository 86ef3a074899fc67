"""The config layer: the top-level schemas (ConfigStore), the command line's group check, and
validation of a composed config against each selected option's schema."""

from turbotrain.config.command_line import check_group_options, exit_on_unknown_option
from turbotrain.config.help import exit_on_help, help_text
from turbotrain.config.schemas import (
    KNOBS,
    NUMERICS_KNOBS,
    ExportConfig,
    TrainConfig,
    TrainerConfig,
    is_numeric,
    register_configs,
    registries,
)
from turbotrain.core.schema import ConfigError

__all__ = [
    "KNOBS",
    "NUMERICS_KNOBS",
    "ConfigError",
    "ExportConfig",
    "TrainConfig",
    "TrainerConfig",
    "check_group_options",
    "exit_on_help",
    "exit_on_unknown_option",
    "help_text",
    "is_numeric",
    "register_configs",
    "registries",
]
