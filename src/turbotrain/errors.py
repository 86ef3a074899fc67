"""The errors a user can fix, and how the entry points report them: one line, exit 2."""

from __future__ import annotations

import sys

from turbotrain.checkpoint import CheckpointError
from turbotrain.config import ConfigError
from turbotrain.distributed import LaunchError

USER_ERRORS = (ConfigError, CheckpointError, LaunchError, FileNotFoundError)


def report(error: BaseException) -> None:
    print(f"error: {error}", file=sys.stderr)
