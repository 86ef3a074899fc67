"""The documentation site: it builds strictly, its configuration reference is the schemas', and every
`python train.py ...` / `python export.py ...` command it shows still composes."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from conftest import ROOT, make_cfg
from turbotrain.config import reference
from turbotrain.config.command_line import exit_on_unknown_option
from turbotrain.config.validation import validate

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"(?:python |torchrun [^#`]*?)((?:train|export)\.py\b[^#`]*)")


def _shown_commands() -> list[tuple[str, str]]:
    """(page, the arguments after train.py/export.py) for every command in a code block or an
    inline code span that starts with `python`; a syntax line (`[run=<run dir>]`, `a|b`) is not a command."""
    found = []
    for page in PAGES:
        text = page.read_text().replace("\\\n", " ")  # a continued shell line is one command
        blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M)
        spans = re.findall(r"`(python [^`]+)`", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M))
        for line in [*(ln for b in blocks for ln in b.splitlines()), *spans]:
            if (m := COMMAND.search(line)) and not re.search(r"\[|<[^>]*\|", m.group(1)):
                found.append((page.name, " ".join(m.group(1).split())))
    return found


def test_the_docs_show_commands_to_check():
    shown = _shown_commands()
    assert len(shown) > 30 and {p for p, _ in shown} >= {"README.md", "getting-started.md", "distributed.md"}


def _first_of_each_sweep(overrides: list[str]) -> list[str]:
    parsed = OverridesParser.create().parse_overrides(overrides)
    return [
        f"{o.get_key_element()}={next(iter(o.sweep_string_iterator()))}" if o.is_sweep_override() else o.input_line
        for o in parsed
    ]


@pytest.mark.parametrize(("page", "command"), _shown_commands())
def test_every_command_the_docs_show_composes(page, command):
    script, *args = shlex.split(re.sub(r"<[^>]+>", "x", command))  # <run>: a value the reader fills in
    args = [a for a in args if a not in ("-m", "--multirun", "--help", "--cfg", "job")]
    args = [a for a in args if not a.startswith(("hydra/", "hydra."))]  # Hydra's own settings: not ours to check
    config = "train" if script == "train.py" else "export"
    exit_on_unknown_option(args, ROOT / "conf")
    cfg = make_cfg(*_first_of_each_sweep(args), config_name=config)
    if config == "train":
        validate(cfg)


def test_the_configuration_reference_is_the_schemas_and_says_what_every_key_means():
    text = (ROOT / "docs" / "reference.md").read_text()
    assert text == reference.page(), "docs/reference.md is out of date: run python -m bench readme"
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) > 200
    assert [r for r in rows if r.rstrip().endswith("|  |")] == []  # a key without a comment beside it in its schema


def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("material", reason="the [docs] extra (mkdocs-material) is not installed")
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "index.html").is_file()


def test_the_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150
    for page in re.findall(r"\]\((docs/[^)#]+)", "\n".join(lines)):
        assert (ROOT / page).is_file(), page
    assert Path(ROOT / "mkdocs.yml").is_file()
