"""The command line before Hydra parses it: an unknown `group=option` is one line, not Hydra's dozen."""

from __future__ import annotations

import sys
from pathlib import Path


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


def exit_on_unknown_option(argv: list[str], conf_dir) -> None:
    """Before Hydra starts: an unknown `group=option` ends the process with one line, exit 2."""
    problem = check_group_options(argv, conf_dir)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
