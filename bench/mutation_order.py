"""pytest plugin for bench/mutation.py's mutant runs: the tests that cover a mutant run cheapest
first, and only as many as fit the job's budget of test seconds per mutant.

mutmut passes them in set order and stops at the first failure (-x), so a mutant a 0.1 s test
kills could wait behind a 30 s training run. A test's cost is its own time (the one mutmut's
stats pass recorded, in mutmut-stats.json in the mutants/ folder the tests run from) plus the
set-up of the fixtures it needs that no test picked before it paid for (a trained run behind a
module's tests: mutmut's times leave that out, and each forked mutant pays it again). Fixture
set-up times are recorded by every session this plugin runs in (the clean-test pass times them
all) into FIXTURES. A test never timed goes last. The budget (BUDGET_ENV, seconds; unset: every
covering test) bounds what a surviving mutant costs: a function every training test runs is
covered by ten minutes of them. The first test always runs, whatever its cost."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

STATS = Path("mutmut-stats.json")
# fixture -> the shortest set-up seen: a loaded machine's stall would otherwise stay on record (a
# 10 s one on a function-scoped autouse fixture charged every test that, and 3 tests filled a budget)
FIXTURES = Path("mutmut-fixture-seconds.json")
BUDGET_ENV = "TURBOTRAIN_MUTATION_BUDGET_S"
_timed: dict[str, float] = {}


def _key(fixturedef) -> str:
    return f"{fixturedef.baseid}::{fixturedef.argname}"


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """The fixture's own set-up (pytest has set up the fixtures it asks for before this hook)."""
    t0 = time.perf_counter()
    yield
    seconds = time.perf_counter() - t0
    _timed[_key(fixturedef)] = min(_timed.get(_key(fixturedef), seconds), seconds)


def pytest_sessionfinish(session) -> None:
    if not _timed:
        return
    seen = json.loads(FIXTURES.read_text()) if FIXTURES.is_file() else {}
    merged = {**seen, **{k: min(v, seen.get(k, v)) for k, v in _timed.items()}}
    temp = FIXTURES.with_suffix(f".{os.getpid()}.tmp")  # two mutants finish at once: whole files only
    temp.write_text(json.dumps(merged))
    temp.replace(FIXTURES)


def _cost(item, durations: dict[str, float], fixtures: dict[str, float], paid: set[str], unknown: float) -> float:
    """The test's time plus its fixtures' set-up: per test for function-scoped ones, once for the
    others (`paid`: those an earlier pick set up, updated)."""
    cost = durations.get(item.nodeid, unknown)
    info = getattr(item, "_fixtureinfo", None)  # pytest's own record of what the test asks for
    for defs in info.name2fixturedefs.values() if info else ():
        fixturedef = defs[-1]  # the one that applies: the closest override
        key = _key(fixturedef)
        if fixturedef.scope == "function" or key not in paid:
            cost += fixtures.get(key, 0.0)
            paid.update([key] if fixturedef.scope != "function" else [])
    return cost


def pytest_collection_modifyitems(config, items: list) -> None:
    if not STATS.is_file():  # the stats pass itself: nothing timed yet
        return
    durations = json.loads(STATS.read_text())["duration_by_test"]
    fixtures = json.loads(FIXTURES.read_text()) if FIXTURES.is_file() else {}
    items.sort(key=lambda item: _cost(item, durations, fixtures, set(), float("inf")))
    if "__mutmut_" not in os.environ.get("MUTANT_UNDER_TEST", "") or BUDGET_ENV not in os.environ:
        return  # the clean-test pass runs them all
    budget, spent, keep, paid = float(os.environ[BUDGET_ENV]), 0.0, [], set()
    for item in items:
        spent += _cost(item, durations, fixtures, paid, budget)
        if keep and spent > budget:
            break
        keep.append(item)
    config.hook.pytest_deselected(items=items[len(keep) :])
    items[:] = keep
