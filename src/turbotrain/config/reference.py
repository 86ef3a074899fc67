"""docs/reference.md's text, generated from the schemas: every group, option and key with its type,
default, allowed values, resume rule and meaning (the comment written beside or above the field).
`python -m bench readme` writes the page (it imports turbotrain.options, which fills the
registries this reads); `--check` fails when it is stale."""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable

from turbotrain.config.schemas import TrainerConfig, is_numeric, registries
from turbotrain.core.schema import describe

FIELD = re.compile(r"^\s+(\w+)\s*:\s*[^=]+(?:=.*)?$")

INTRO = """# Configuration reference

Generated from the config schemas by `python -m bench readme` (a test fails when
this page and the schemas disagree). Set a key on the command line as `group.key=value`
(`optim.lr=0.05`), pick an option as `group=option` (`optim=adamw`); `python train.py --cfg job`
prints the composed config.

The **resume** column says what `trainer.resume` does when the key's value differs from the
checkpoint's: *refused* (the run would compute something else; `trainer.resume_strict=false`
allows it) or *free*. `max_epochs` and `max_steps` may always grow. Defaults are the schemas';
an option's file under `conf/<group>/` may set a few of its own (a required `data.root: ???`),
and a recipe under `conf/experiment/` sets several groups at once.
"""


def _comments(schema: type) -> dict[str, str]:
    """field name -> the comment on its line, else the comment lines right above it, per class in the MRO."""
    out: dict[str, str] = {}
    for cls in reversed([c for c in schema.__mro__ if dataclasses.is_dataclass(c)]):
        above: list[str] = []
        for line in inspect.getsource(cls).splitlines()[1:]:
            code, _, comment = line.partition("  # ")
            if line.strip().startswith("#"):
                above.append(line.strip().lstrip("# ").strip())
                continue
            if (m := FIELD.match(code)) and m.group(1) in cls.__dict__.get("__annotations__", {}):
                # a subclass that only changes a default keeps its base's meaning
                out[m.group(1)] = comment.strip() or " ".join(above) or out.get(m.group(1), "")
            above = []
    return out


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    return "`???` (required)" if value == "???" else f"`{value!r}`".replace("|", "\\|")


def _allowed(f: dataclasses.Field) -> str:
    if f.metadata.get("choices"):
        return ", ".join(f"`{c}`" for c in f.metadata["choices"])
    return describe(f.metadata["bound"]).removeprefix("must be ") if f.metadata.get("bound") else ""


def _row(group: str, f: dataclasses.Field, meaning: str) -> str:
    resume = "refused" if is_numeric(group, f) else "free"
    kind, meaning = (text.replace("|", "\\|") for text in (str(f.type), meaning))  # a bar would end the cell
    return f"| `{f.name}` | `{kind}` | {_default(f)} | {_allowed(f)} | {resume} | {meaning} |"


def _table(group: str, schema: type, keep: Callable[[str], bool] = lambda key: True) -> list[str]:
    comments = _comments(schema)
    rows = [_row(group, f, comments.get(f.name, "")) for f in dataclasses.fields(schema) if keep(f.name)]
    return ["| key | type | default | allowed | resume | meaning |", "|---|---|---|---|---|---|", *rows, ""]


def _signature(group: str, f: dataclasses.Field) -> tuple:
    return (f.name, str(f.type), _default(f), _allowed(f), is_numeric(group, f))


def page() -> str:
    lines = [INTRO, "## trainer", "", "Keys of every run: `trainer.<key>=value`.", ""]
    lines += _table("trainer", TrainerConfig)
    for group, registry in sorted(registries().items()):
        options = list(registry)
        fields = {o.name: {f.name: _signature(group, f) for f in dataclasses.fields(o.schema)} for o in options}
        shared = [n for n, sig in fields[options[0].name].items() if all(fields[o.name].get(n) == sig for o in options)]
        lines += [f"## {group}", "", f"Options: {', '.join(f'`{d}`' for d in registry.described())}.", ""]
        if len(options) > 1 and shared:
            lines += [f"Keys every `{group}` option has:", "", *_table(group, options[0].schema, shared.__contains__)]
        for o in options:
            own = set(fields[o.name]) - set(shared if len(options) > 1 else ())
            if own:
                lines += [f"### {group}={o.name}", "", *_table(group, o.schema, own.__contains__)]
    return "\n".join(lines).rstrip() + "\n"
