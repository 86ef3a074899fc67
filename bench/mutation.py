"""Mutation testing of the modules that decide a run's numbers and its safety, with mutmut 3
(`pip install -e .[mutation]`): each mutant (an operator, a constant, a keyword argument changed
in one place) runs the default suite's tests that execute the mutated function (mutmut records
which in a first pass), cheapest first (their fixtures' set-up counted: bench/mutation_order.py)
and up to TEST_BUDGET_S seconds of them, in processes forked from a fork server (torch is not
fork-safe once its thread pool has run). A mutant is killed when one of those tests fails or
runs past its CPU-time limit (see _configure).
Tests that start train.py or torchrun run the unmutated package in those processes (mutmut's
trampolines cannot run outside its own): code only they reach counts as "no tests".

`python -m bench mutation [module ...]` (default: every module of MODULES) works in one copy of
the tree under WORK, brought to HEAD at each start: mutmut keeps the verdicts of every function
whose source is unchanged, so a stopped job continues where it was, and tries the survivors of
earlier runs again against the tests as they are now (an edited test file's tests mapped anew to
the functions they reach). It writes bench/results/mutation.json:
per module the mutants, how many were killed, the survivors with their diffs, and the score over
the mutants that are not listed in bench/mutation_equivalent.py."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from bench.common import RESULTS, ROOT, write
from bench.mutation_equivalent import EQUIVALENT
from bench.mutation_order import BUDGET_ENV
from bench.mutation_verdicts import record, seed_tree
from turbotrain.core.atomic import atomic_write_text

WORK = Path(os.path.expanduser("~/.cache/turbotrain/bench/mutation"))
TEST_HASHES = WORK / "test_hashes.json"  # the test files as the last run's stats saw them
BEYOND = WORK / "beyond_budget.json"  # mutants killed by a run of every covering test (--beyond-budget)
# seconds of covering tests (their stats-pass times and fixture set-up, cheapest first) a mutant
# runs: a survivor of a function every training test runs would otherwise cost ten minutes; a
# survivor is worth trying against the rest (mutmut run <name>, budget unset) before a test is
# written for it
TEST_BUDGET_S = 30.0
MODULES = [
    f"src/turbotrain/{m}.py"
    for m in (
        "train/loop",
        "train/resume",
        "train/run",
        "train/optim",
        "train/sched",
        "train/ema",
        "train/summary",
        "data/loader",
        "data/listing",
        "data/tars",
        "data/arrow",
        "core/atomic",
        "core/checkpoint",
        "deploy/quantize",
    )
]
KILLED = ("killed", "timeout", "segfault")  # a test failed, hung or crashed: the change was seen
LIVED = ("survived", "no tests", "suspicious")  # no test saw it (no tests: none ran the function)
# tests of the source text itself (sizes, imports), which mutmut's rewritten functions fail anyway
STRUCTURE_TESTS = (
    "tests/test_readme.py::test_package_declares_every_dependency_it_imports",
    "tests/test_registry.py::test_modules_and_run_functions_stay_small",
    "tests/test_layers.py::test_no_layer_imports_a_later_one",
)


def _work_tree() -> Path:
    """WORK/tree holding the tracked files at HEAD, over what mutmut left there (mutants/, its
    results and its map of tests to functions); files deleted since go too."""
    work = WORK / "tree"
    for name in ("src", "tests", "bench", "conf"):
        shutil.rmtree(work / name, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    (WORK / "tree.commit").write_text(commit.strip())
    return work


def _configure(work: Path) -> None:
    """Every module of MODULES is mutmut's to mutate, whichever a run checks (it names them): mutmut
    forgets which tests cover the functions of a file it is not told to mutate, and a later run of
    that file would find none (each of its mutants "no tests") until a new stats pass."""
    text = (work / "pyproject.toml").read_text().split("\n[tool.mutmut]")[0]
    copied = sorted(p.name for p in work.iterdir() if p.name not in ("src", "mutants", "pyproject.toml"))
    config = [
        "[tool.mutmut]",
        'source_paths = ["src"]',
        f"only_mutate = {MODULES!r}",
        'pytest_add_cli_args_test_selection = ["tests/"]',
        f"pytest_add_cli_args = {['-p', 'bench.mutation_order', *(a for t in STRUCTURE_TESTS for a in ('--deselect', t))]!r}",
        f"also_copy = {copied!r}",
        'process_isolation = "forkserver"',
        # CPU-second limit = (tests' time + constant) x multiplier x 2. mutmut's default multiplier
        # (15) lets a mutant that loops run for hours where the training tests cover a function; 3
        # still spares a loaded machine. Its time leaves out fixture set-up, which each forked
        # mutant pays again (a module's trained run: tens of CPU seconds on 2 threads), so the
        # constant (default 1) is what keeps a quick test behind a training fixture from timing out.
        "timeout_multiplier = 3.0",
        "timeout_constant = 20.0",
    ]
    (work / "pyproject.toml").write_text(text.rstrip() + "\n\n" + "\n".join(config).replace("'", '"') + "\n")


def _results(work: Path) -> dict[str, str]:
    out = subprocess.run(["mutmut", "results", "--all", "true"], cwd=work, capture_output=True, text=True, check=True).stdout
    return dict(re.findall(r"^\s+(\S+): (.+)$", out, re.M))


def _module(mutant: str) -> str:
    return "src/" + re.split(r"\.x[_ǁ]", mutant, maxsplit=1)[0].replace(".", "/") + ".py"


def run(*modules: str, children: int = 2, left_only: bool = False) -> Path:
    """`left_only`: name to mutmut the mutants an earlier run left unchecked or saw survive, so its
    clean-test pass runs only their tests (all of them otherwise: ten minutes before the first
    mutant). A function changed since that run gets new mutants, which a second such run checks."""
    modules = list(modules) or MODULES
    if shutil.which("mutmut") is None:
        raise SystemExit("bench mutation needs mutmut: pip install -e .[mutation]")
    work = _work_tree()
    _configure(work)
    seed_tree(work, _recorded(), MODULES)
    _forget_changed_tests(work)
    left = _forget_survivors(work, modules)
    t0 = time.perf_counter()
    if left_only and not left:
        return collect(modules)
    some = [] if modules == MODULES else [_pattern(m) for m in modules]
    with open(WORK / "mutmut.log", "w") as log:  # its progress, and why a clean-test pass failed
        env = {**os.environ, BUDGET_ENV: str(TEST_BUDGET_S)}
        command = ["mutmut", "run", "--max-children", str(children), *(left if left_only else some)]
        done = subprocess.run(command, cwd=work, env=env, stdout=log, stderr=log, check=False)
    if done.returncode != 0:
        raise SystemExit(f"mutmut run failed (exit {done.returncode}); its output: {WORK / 'mutmut.log'}")
    return collect(modules, seconds=time.perf_counter() - t0, children=children)


def again(*mutants: str, budget: bool = True, children: int = 2) -> Path:
    """Check the named mutants again: a timeout while the machine was busy with something else, or
    the job paused (mutmut's wall-clock limit runs on), is not a kill. budget=False runs them
    against every test that covers them and records which this kills, for the table to count those
    kills apart (a budgeted run would not have made them)."""
    work = WORK / "tree"
    for module in {_module(m) for m in mutants}:
        _forget(work, module, lambda k, v: k in mutants)
    with open(WORK / "mutmut.log", "w") as log:
        env = {k: v for k, v in os.environ.items() if k != BUDGET_ENV}
        env.update({BUDGET_ENV: str(TEST_BUDGET_S)} if budget else {})
        command = ["mutmut", "run", "--max-children", str(children), *mutants]
        subprocess.run(command, cwd=work, env=env, stdout=log, stderr=log, check=True)
    if not budget:
        status = _results(work)
        atomic_write_text(BEYOND, json.dumps(sorted(_beyond() | {m for m in mutants if status.get(m) in KILLED})))
    return collect(sorted({_module(m) for m in mutants}), children=children)


def _beyond() -> set[str]:  # the mutants this machine's --beyond-budget runs killed
    return set(json.loads(BEYOND.read_text())) if BEYOND.is_file() else set()


def _recorded() -> dict:
    path = RESULTS / "mutation.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _pattern(module: str) -> str:
    """The mutmut names of a module's mutants, as a pattern: src/turbotrain/data/tars.py -> turbotrain.data.tars.x*"""
    return module.removeprefix("src/").removesuffix(".py").replace("/", ".") + ".x*"


def _forget_changed_tests(work: Path) -> None:
    """mutmut maps each test to the functions it runs once, when it first sees the test's name: a
    test edited since (one that now reaches checkpoint.payload, say) would keep its old reach.
    The tests of every file changed since the last run (all of them, where no run recorded its
    files: TEST_HASHES) leave mutmut's stats, so it maps them again as new tests."""
    hashes = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((work / "tests").glob("*.py"))}
    seen = json.loads(TEST_HASHES.read_text()) if TEST_HASHES.is_file() else {}
    changed = {f"tests/{name}" for name, digest in hashes.items() if seen.get(name) != digest}
    path = work / "mutants" / "mutmut-stats.json"
    if changed and path.is_file():
        stats = json.loads(path.read_text())
        stale = {t for t in stats["duration_by_test"] if t.split("::")[0] in changed}
        stats["duration_by_test"] = {t: d for t, d in stats["duration_by_test"].items() if t not in stale}
        by_function = stats["tests_by_mangled_function_name"]
        stats["tests_by_mangled_function_name"] = {f: [t for t in ts if t not in stale] for f, ts in by_function.items()}
        atomic_write_text(path, json.dumps(stats))  # a kill mid-write would cost mutmut a full stats pass
    atomic_write_text(TEST_HASHES, json.dumps(hashes))


def _forget_survivors(work: Path, modules: list[str]) -> list[str]:
    """Mark the mutants no test saw in an earlier run (survived, no tests) unchecked, so this run
    tries them against today's tests in the same pass as the new ones (one clean-test pass, not
    two), except those judged equivalent (each would run its whole test budget to survive again:
    a changed function gets new mutants anyway); returns every mutant now unchecked. mutmut 3.8's
    results file per module: exit code 0 survived, 33 no tests, None unchecked."""
    return [k for module in modules for k in _forget(work, module, lambda k, v: v in (0, 33) and k not in EQUIVALENT)]


def _forget(work: Path, module: str, which) -> list[str]:
    """Mark the module's mutants `which(name, exit code)` picks unchecked in mutmut's results file
    (mutmut checks a mutant only while it has no verdict); returns every one now unchecked."""
    meta = work / "mutants" / f"{module}.meta"
    if not meta.is_file():
        return []
    data = json.loads(meta.read_text())
    data["exit_code_by_key"] = {k: None if which(k, v) else v for k, v in data["exit_code_by_key"].items()}
    atomic_write_text(meta, json.dumps(data))
    return [k for k, v in data["exit_code_by_key"].items() if v is None]


def collect(modules: list[str], seconds: float | None = None, children: int = 2) -> Path:
    """mutation.json from the work tree's results so far (a stopped run's too: its unchecked mutants
    are counted apart). Modules not named keep what an earlier run wrote for them, each under the
    commit its tests were at."""
    work, commit = WORK / "tree", (WORK / "tree.commit").read_text()
    status = _results(work)
    beyond = _beyond()
    earlier = _recorded()
    per_module = dict(earlier.get("modules", {}))
    for module in modules:
        mine = {m: s for m, s in status.items() if _module(m) == module}
        survivors = {m: _show(work, m) for m, s in mine.items() if s in LIVED and m not in EQUIVALENT}
        key = module.removeprefix("src/turbotrain/")
        beyond |= set(per_module.get(key, {}).get("killed_beyond_budget", ()))  # recorded on another machine
        per_module[key] = {
            "commit": commit,
            "seconds": seconds,
            "status": dict(Counter(mine.values())),
            "survivors": survivors,
            # killed only by a test beyond the budget (a budgeted run since may have killed it too)
            "killed_beyond_budget": sorted(m for m, s in mine.items() if s in KILLED and m in beyond),
            # with its diff, to check against its reason (a mutant's number moves when its function changes);
            # one a test killed is not
            "equivalent": {m: _show(work, m) for m, s in sorted(mine.items()) if s in LIVED and m in EQUIVALENT},
            "verdicts": record(work / "mutants" / f"{module}.meta"),
        }
    payload = {"children": children, "test_budget_s": TEST_BUDGET_S, "modules": per_module, "equivalent": EQUIVALENT}
    payload["exempt"] = exempt_lines(MODULES)
    return write("mutation", {**payload, "scores": scores(payload)})


def exempt_lines(modules: list[str]) -> dict[str, str]:
    """file:line -> the line, for each line marked `# pragma: no mutate` (mutmut makes no mutant
    of it); the comment above it or on it says why."""
    out = {}
    for module in modules:
        for n, line in enumerate((ROOT / module).read_text().splitlines(), 1):
            if "# pragma: no mutate" in line:
                out[f"{module.removeprefix('src/turbotrain/')}:{n}"] = line.strip()
    return out


def _show(work: Path, mutant: str) -> str:
    return subprocess.run(["mutmut", "show", mutant], cwd=work, capture_output=True, text=True).stdout


def scores(result: dict) -> dict[str, dict]:
    """Per module: mutants checked, killed, judged equivalent, and killed / (checked - equivalent)."""
    out = {}
    for module, m in result["modules"].items():
        counts = m["status"]
        checked = sum(n for s, n in counts.items() if s in KILLED + LIVED)
        killed = sum(counts.get(s, 0) for s in KILLED)
        equivalent = len(m.get("equivalent", ()))
        denominator = checked - equivalent
        out[module] = {
            "checked": checked,
            "killed": killed,
            "killed_beyond_budget": len(m.get("killed_beyond_budget", ())),
            "equivalent": equivalent,
            "unchecked": counts.get("not checked", 0),  # a stopped run's: its score is over the rest only
            "score": killed / denominator if denominator else None,
        }
    return out


if __name__ == "__main__":  # python -m bench.mutation [--collect | --left] [module ...] | --again|--beyond-budget mutant ...
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if {"--again", "--beyond-budget"} & set(sys.argv):
        print(again(*args, budget="--again" in sys.argv))
    else:
        print(collect(args or MODULES) if "--collect" in sys.argv else run(*args, left_only="--left" in sys.argv))
