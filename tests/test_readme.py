"""The documentation stands alone and its figures come from bench/results/*.json, nowhere else."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import readme
from conftest import ROOT

GENERATED = re.compile(r"<!-- bench:(\w+):start -->.*?<!-- bench:\1:end -->", re.S)
# a measured figure: a number with a unit of time, size, speed or share
FIGURE = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)?\s?(?:%|x(?!\w)|ms\b|MB\b|GB\b|samples/s|s/step|min\b|points\b)")
# numbers in prose that are rules or constants, not measurements
RULES = ("spread over 10 %", "to 91.5 % top-1", "longer, to 93 %", "to 95 % top-1")  # the last three: time-to-accuracy targets
# the team's notes beside the repository: a clone does not have them
OUTSIDE_NOTES = re.compile(r"\.\./" + "sha" + r"red|DESIGN\.md")


def test_readme_figures_match_the_committed_results():
    assert readme.check() == []
    r = subprocess.run([sys.executable, "-m", "bench", "readme", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


@pytest.mark.parametrize(
    ("name", "edit"),
    [
        ("recipes.json", lambda d: d["recipes"]["default"]["export"].update(latency_ms=123.456)),  # a raw figure
        ("inference.json", lambda d: d["results"]["resnet18@64"]["b1_ms"].update({"int8 torchscript": 0.5})),
        # every repeat: the row quotes a median
        ("attention.json", lambda d: [r.update(step_s=1.0) for r in d["results"]["2048 fp32"]["sliding w=256"]]),
        ("prune.json", lambda d: d["hardware"].update(cpu="Intel Xeon")),  # the hardware named per table
        ("attention_flex.json", lambda d: d["results"]["2048"].update(backward=None)),  # a probe's outcome
        ("time_to_accuracy_bf16.json", lambda d: d["recipes"]["speedrun"]["runs"][0].update(acc1=0.5)),  # one seed's top-1
    ],
)
def test_an_edited_result_file_fails_the_check(tmp_path, name, edit):
    results = tmp_path / "results"
    shutil.copytree(readme.RESULTS, results)
    data = json.loads((results / name).read_text())
    edit(data)
    (results / name).write_text(json.dumps(data))
    diff = readme.check(results)
    assert diff and any(line.startswith("+") and not line.startswith("+++") for line in diff)


def test_a_result_file_of_an_earlier_recipe_says_so(tmp_path):
    """Tables from runs of a speedrun whose ablation has since changed say which recipe they measured."""
    from bench.time_to_accuracy import figures, section

    results = tmp_path / "results"
    shutil.copytree(readme.RESULTS, results)
    assert "as it was then" not in section(results, "images")
    path = results / "time_to_accuracy_bf16.json"
    data = json.loads(path.read_text())
    data["ablation"].pop(next(iter(data["ablation"])))
    path.write_text(json.dumps(data))
    assert f"Measured on {data['date']} with `speedrun` as it was then" in section(results, "images")
    assert figures(data)[0]["ours"].endswith(f"; speedrun as it was on {data['date']})")


# reference.md is generated whole from the schemas (test_docs.py): its numbers are defaults and rules
@pytest.mark.parametrize("page", ["README.md", *sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "reference.md")])
def test_the_docs_prose_quotes_no_figure_of_its_own(page):
    """Outside the generated sections, a page may interpret figures but not restate them."""
    path = ROOT / page if page == "README.md" else ROOT / "docs" / page
    prose = GENERATED.sub("", path.read_text())
    for rule in RULES:
        prose = prose.replace(rule, "")
    found = [(n, m) for n, line in enumerate(prose.splitlines(), 1) for m in FIGURE.findall(line)]
    assert found == [], f"typed figures (generate them from bench/results instead): {found[:10]}"


def _tracked() -> list[Path]:
    r = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    names = r.stdout.splitlines() if r.returncode == 0 else []
    return [ROOT / n for n in names if (ROOT / n).is_file()] or [p for p in ROOT.rglob("*") if p.is_file()]


def test_no_file_links_outside_the_repository():
    link = re.compile(r"\]\(([^)\s#]+)")
    for path in _tracked():
        if path.suffix in (".png", ".pt", ".jpg"):
            continue
        text = path.read_text(errors="replace")
        assert not OUTSIDE_NOTES.search(text), path
        if path.suffix != ".md":
            continue
        for target in link.findall(text):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            resolved = (path.parent / target).resolve()
            assert resolved.is_relative_to(ROOT) and resolved.exists(), (path.relative_to(ROOT), target)


def _imports(path: Path) -> tuple[set[str], set[str]]:
    """Third-party top-level module names imported at module level, and inside functions."""
    import ast

    module, lazy = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for root in {n.split(".")[0] for n in names} - set(sys.stdlib_module_names) - {"turbotrain"}:
            (module if node.col_offset == 0 else lazy).add(root)
    return module, lazy


def test_package_declares_every_dependency_it_imports():
    """`pip install .` alone gives a working package: what turbotrain imports at load time is a
    dependency, what it imports for an option is a dependency or an extra."""
    import tomllib
    from importlib.metadata import packages_distributions

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    name = re.compile(r"[A-Za-z0-9_.-]+")
    core = {name.match(d).group().lower() for d in project["dependencies"]}
    extras = {name.match(d).group().lower() for ds in project["optional-dependencies"].values() for d in ds}
    dists = packages_distributions()
    sources = list((ROOT / "src" / "turbotrain").rglob("*.py"))
    assert len(sources) > 50, "the package's sources moved: this check would see nothing"
    for path in sources:
        module, lazy = _imports(path)
        for root in module | lazy:
            declared = {d.lower() for d in dists.get(root, [root])}
            allowed = core if root in module else core | extras
            assert declared & allowed, f"{path.relative_to(ROOT)} imports {root} ({declared}): not in pyproject.toml"
