"""The package's shape: layers whose imports go one way, no import cycle (deferred imports
counted), and one explicit list of the modules that register options."""

from __future__ import annotations

import ast
import re

import pytest

import turbotrain.options
from conftest import ROOT

SRC = ROOT / "src" / "turbotrain"
assert (SRC / "train" / "loop.py").is_file(), SRC  # the checks below walk this tree: moved, they must fail
# lowest first: a module may import its own layer and the layers before it, never a later one
LAYERS = ("core", "config", "compression", "models", "data", "train", "deploy", "options")


def _module(path) -> str:
    return ".".join(path.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__")


MODULES = {_module(p): p for p in SRC.rglob("*.py")}


def _resolve(name: str) -> str | None:
    """The turbotrain module an imported name lives in (`a.b.C` -> `a.b`)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(source: str, module: str) -> set[str]:
    """Every turbotrain module `source` imports, at the top or inside a function."""
    found = set()
    package = module if module in MODULES and MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the importing module's package
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}".rstrip(".")
            if base.split(".")[0] == "turbotrain":
                found.update(_resolve(f"{base}.{a.name}") for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(_resolve(a.name) for a in node.names if a.name.split(".")[0] == "turbotrain")
    found.discard(None)
    found.discard(module)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(mod: str, path: list[str]) -> list[str] | None:
        state[mod] = 1
        for dep in sorted(graph.get(mod, ())):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state and (found := visit(dep, [*path, dep])):
                return found
        state[mod] = 2
        return None

    for mod in sorted(graph):
        if mod not in state and (cycle := visit(mod, [mod])):
            return cycle
    return None


def layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 else len(LAYERS)  # the package itself: above all


GRAPH = {m: imports(p.read_text(), m) for m, p in MODULES.items()}


def test_every_module_belongs_to_a_layer():
    assert all(m == "turbotrain" or m.split(".")[1] in LAYERS for m in MODULES), sorted(MODULES)


def test_no_import_cycle_counting_deferred_imports():
    cycle = find_cycle(GRAPH)
    assert cycle is None, " -> ".join(cycle)


def test_no_layer_imports_a_later_one():
    upward = [f"{m} -> {d}" for m, deps in GRAPH.items() for d in deps if layer(d) > layer(m)]
    assert not upward, upward


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f():\n    from turbotrain.train.loop import evaluate\n", {"turbotrain.train.loop"}),
        ("from turbotrain.core import checkpoint as c\n", {"turbotrain.core.checkpoint"}),
        ("import turbotrain.models.catalog\n", {"turbotrain.models.catalog"}),
        ("from .catalog import MODELS\n", {"turbotrain.models.catalog"}),
    ],
)
def test_the_import_reader_sees_deferred_aliased_and_relative_imports(source, expected):
    assert imports(source, "turbotrain.models.vision") == expected


def test_the_checks_catch_a_deferred_cycle_and_an_upward_import():
    graph = {**GRAPH, "turbotrain.core.checkpoint": GRAPH["turbotrain.core.checkpoint"] | {"turbotrain.models.saved"}}
    assert find_cycle(graph) is not None  # models.saved imports core.checkpoint
    assert layer("turbotrain.models.saved") > layer("turbotrain.core.checkpoint")


def test_every_module_that_registers_an_option_is_listed():
    registers = re.compile(r"^@\w+\.register\(", re.M)
    listed = {m.__name__ for m in turbotrain.options.MODULES}
    registering = {m for m, p in MODULES.items() if registers.search(p.read_text())}
    assert registering == listed, f"add to turbotrain/options.py: {sorted(registering - listed)}"
