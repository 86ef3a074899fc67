"""A checkpoint is data from wherever it came from: what it says is checked before anything is
built, imported or downloaded from it. `weights_only=True` already keeps code out; this keeps
out a config that would resolve environment variables (`${oc.env:...}`) and architecture fields
that would build a huge model or fetch an arbitrary path."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from turbotrain.core.registry import require_options

# arch field -> (low, high), inclusive; generous for real models, far below what exhausts memory
ARCH_BOUNDS = {
    "num_classes": (2, 100_000),
    "in_channels": (1, 16),
    "image_size": (8, 4096),
    "max_length": (1, 65_536),
    "vocab_size": (1, 1_000_000),
}
MODEL_BOUNDS = {"width": (1, 4096)}
HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?")


class UntrustedCheckpoint(ValueError):
    """What a checkpoint says is outside what turbotrain writes."""


def _strings(value: Any, key: str):
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, f"{key}.{k}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from _strings(v, f"{key}[{i}]")


ARCH_CHECKS: list[Callable[[dict], None]] = []  # registered by the layers that know the fields


def register_arch_check(check: Callable[[dict], None]) -> Callable[[dict], None]:
    """Decorator: `check(arch)` raises UntrustedCheckpoint for what its layer would never write
    (the model catalog: a model name of the wrong kind; compression: structure records)."""
    ARCH_CHECKS.append(check)
    return check


def int_in(value: Any, bounds: tuple[int, int], key: str) -> None:
    low, high = bounds
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UntrustedCheckpoint(f"{key}={value!r} is outside [{low}, {high}]")


def _model_source(value: Any, key: str) -> None:
    """A hub name (owner/name) or a folder that exists here; nothing else is fetched."""
    if value is None:
        return
    if not isinstance(value, str) or not (HUB_NAME.fullmatch(value) or Path(value).is_dir()):
        raise UntrustedCheckpoint(f"{key}={value!r} is neither a hub name (owner/name) nor a folder on this machine")


def check_arch(arch: dict) -> None:
    require_options()  # every option module imported: every layer's check is registered
    kind = arch.get("kind")
    if kind not in ("image", "text"):
        raise UntrustedCheckpoint(f"arch.kind={kind!r} is not image or text")
    keys = ["num_classes"] + (["max_length", "vocab_size"] if kind == "text" else ["in_channels", "image_size"])
    for key in keys:
        int_in(arch.get(key), ARCH_BOUNDS[key], f"arch.{key}")
    names = arch.get("class_names")
    if not isinstance(names, list) or len(names) != arch["num_classes"]:
        raise UntrustedCheckpoint(f"arch.class_names must list arch.num_classes={arch['num_classes']} names")
    model = arch.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("name"), str):
        raise UntrustedCheckpoint("arch.model.name is missing")
    for key, bounds in MODEL_BOUNDS.items():
        if model.get(key) is not None:
            int_in(model[key], bounds, f"arch.model.{key}")
    _model_source(model.get("path"), "arch.model.path")  # arch.tokenizer is a note: export finds the tokenizer itself
    for check in ARCH_CHECKS:
        check(arch)


def check(ckpt: dict) -> None:
    """Raises UntrustedCheckpoint naming the first field that turbotrain would never write."""
    for key, text in [*_strings(ckpt.get("config"), "config"), *_strings(ckpt.get("arch"), "arch")]:
        if "${" in text:
            line = next(line for line in text.splitlines() if "${" in line).strip()
            raise UntrustedCheckpoint(f"{key} holds an interpolation ({line[:80]!r}); turbotrain saves resolved configs")
    if "arch" in ckpt:  # every checkpoint a run writes has one; bare test files may not
        check_arch(ckpt["arch"])
