"""pytest plugin for bench/mutation.py's mutant runs: the tests that cover a mutant run fastest
first, and only as many as fit the job's budget of test seconds per mutant.

mutmut passes them in set order and stops at the first failure (-x), so a mutant a 0.1 s test
kills could wait behind a 30 s training run; the durations are the ones its stats pass recorded
(mutmut-stats.json, in the mutants/ folder the tests run from). A test it never timed goes last.
The budget (BUDGET_ENV, seconds; unset: every covering test) bounds what a surviving mutant
costs: a function every training test runs is covered by ten minutes of them. The first test
always runs, whatever its time."""

from __future__ import annotations

import json
import os
from pathlib import Path

STATS = Path("mutmut-stats.json")
BUDGET_ENV = "TURBOTRAIN_MUTATION_BUDGET_S"


def pytest_collection_modifyitems(config, items: list) -> None:
    if not STATS.is_file():  # the stats pass itself: nothing timed yet
        return
    durations = json.loads(STATS.read_text())["duration_by_test"]
    items.sort(key=lambda item: durations.get(item.nodeid, float("inf")))
    if "__mutmut_" not in os.environ.get("MUTANT_UNDER_TEST", "") or BUDGET_ENV not in os.environ:
        return  # the clean-test pass runs them all
    budget, spent, keep = float(os.environ[BUDGET_ENV]), 0.0, []
    for item in items:
        spent += durations.get(item.nodeid, budget)
        if keep and spent > budget:
            break
        keep.append(item)
    config.hook.pytest_deselected(items=items[len(keep) :])
    items[:] = keep
