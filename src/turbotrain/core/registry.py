"""One registry per config group: an option is a builder registered under its name together with
its schema dataclass (and, where it matters, the kind of data it works on). Dispatch, the allowed
names in error messages, Hydra's schema for each option, `--help` and the text-vs-image
compatibility checks all read these registries; nothing else lists option names."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from turbotrain.core.schema import ConfigError

KINDS = {"image": "image data (CNNs)", "text": "text data (transformer models)"}


@dataclass(frozen=True)
class Option:
    group: str
    name: str
    build: Callable
    schema: type
    kind: str | None = None  # "image" or "text": the data it works on; None: both
    traits: dict = field(default_factory=dict)  # what callers other than `build` need to know
    family: Callable[[], list[str]] | None = None  # an option answering many names (torchvision models)

    def answers(self, name: str) -> bool:
        return name == self.name or (self.family is not None and name in self.family())

    def fits(self, kind: str) -> bool:
        return self.kind is None or self.kind == kind


class Registry:
    """The options of one config group, in registration order (the order messages list them in)."""

    def __init__(self, group: str):
        if group in REGISTRIES:
            raise ValueError(f"config group {group!r} already has a registry")
        self.group = group
        self.options: dict[str, Option] = {}
        REGISTRIES[group] = self

    def register(self, name: str, schema: type, *, kind: str | None = None, family=None, **traits) -> Callable:
        """Decorator: `build` becomes option `name` of this group (and of every name `family()`
        returns: one builder for a family of architectures)."""
        if kind is not None and kind not in KINDS:
            raise ValueError(f"kind={kind!r}; one of {tuple(KINDS)}")

        def add(build: Callable) -> Callable:
            if name in self.options:
                raise ValueError(f"{self.group}={name} is registered twice")
            self.options[name] = Option(self.group, name, build, schema, kind, traits, family)
            return build

        return add

    def __getitem__(self, name: str) -> Option:
        require_options()
        option = self.options.get(name) or next((o for o in self if o.answers(name)), None)
        if option is None:
            raise ConfigError(f"{self.group}.name={name!r} is not supported; allowed: {', '.join(self.described())}")
        return option

    def __iter__(self) -> Iterator[Option]:
        require_options()
        return iter(self.options.values())

    def described(self, mark_text: bool = False) -> list[str]:
        """The options as a user reads them: a family by what it answers; `(text)` on text-only ones."""
        out = []
        for o in sorted(self, key=lambda o: o.family is not None):  # registration order, families last
            label = o.traits.get("family_doc", o.name) if o.family else o.name
            out.append(f"{label} (text)" if mark_text and o.kind == "text" else label)
        return out

    def names(self, kind: str | None = None) -> list[str]:
        return [o.name for o in self if kind is None or o.fits(kind)]

    def keys(self) -> dict[str, list[str]]:
        """Every key of the group -> the options whose schema has it."""
        owners: dict[str, list[str]] = {}
        for o in self:
            for f in dataclasses.fields(o.schema):
                owners.setdefault(f.name, []).append(o.name)
        return owners

    def composed_schema(self, option: Option) -> type:
        """What Hydra composes an option onto: its schema, plus the other options' keys as untyped
        nulls, so `model.width=8` under model=resnet18 composes (validate checks it as small_cnn's
        key and warns that resnet18 ignores it), while a key no option has (a typo) still fails at
        compose time."""
        own = {f.name for f in dataclasses.fields(option.schema)}
        foreign = [(k, Any, None) for k in self.keys() if k not in own]
        return dataclasses.make_dataclass(option.schema.__name__, foreign, bases=(option.schema,))

    def of(self, group_cfg) -> Option:
        """The option a config group node selects (its `name` key)."""
        return self[group_cfg.name]

    def check_fits(self, group_cfg, kind: str) -> Option:
        """The selected option, or one line saying it does not work on `kind` data and what does."""
        option = self.of(group_cfg)
        if not option.fits(kind):
            raise ConfigError(
                f"{self.group}={option.name} works on {KINDS[option.kind]}, and this run has {KINDS[kind]}; "
                f"{self.group} options for it: {', '.join(self.names(kind))}"
            )
        return option


REGISTRIES: dict[str, Registry] = {}
_options = {"loaded": False}  # set once by turbotrain.options, which imports every option module


def options_loaded() -> None:
    """Called by turbotrain.options after importing every option module: lookups may start."""
    _options["loaded"] = True


def require_options() -> None:
    # a lookup before the options are imported would call a registered option unknown
    if not _options["loaded"]:
        raise RuntimeError("the option registries are incomplete: import turbotrain.options first (the entry points do)")
