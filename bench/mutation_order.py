"""pytest plugin for bench/mutation.py's mutant runs: the tests that cover a mutant run fastest first.

mutmut passes them in set order and stops at the first failure (-x), so a mutant a 0.1 s test
kills could wait behind a 30 s training run; the durations are the ones its stats pass recorded
(mutmut-stats.json, in the mutants/ folder the tests run from). A test it never timed goes last."""

from __future__ import annotations

import json
from pathlib import Path

STATS = Path("mutmut-stats.json")


def pytest_collection_modifyitems(items: list) -> None:
    if not STATS.is_file():  # the stats pass itself: nothing timed yet
        return
    durations = json.loads(STATS.read_text())["duration_by_test"]
    items.sort(key=lambda item: durations.get(item.nodeid, float("inf")))
