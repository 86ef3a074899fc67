"""docs/benchmarks.md's mutation table from bench/results/mutation.json (bench/mutation.py writes it)."""

from __future__ import annotations

import json
from pathlib import Path


def section(results: Path) -> str:
    """docs/benchmarks.md's table: per module, its mutants and the share of them the tests kill."""
    from bench.readme import machine

    if not (results / "mutation.json").is_file():
        return "No run recorded yet: `python -m bench mutation` writes `bench/results/mutation.json` and this table."
    result = json.loads((results / "mutation.json").read_text())
    lines = [
        f"Measured by `python -m bench mutation` (mutmut, {result['children']} children{_budget(result)}) on "
        f"{machine(result['hardware'])}, `bench/results/mutation.json`; score = killed / (checked - equivalent).",
        "",
        "| module | mutants checked | not yet checked | killed | equivalent | survived | score | tests at |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for module, s in result["scores"].items():
        score = "-" if s["score"] is None else f"{100 * s['score']:.1f} %"
        survived = s["checked"] - s["killed"] - s["equivalent"]
        commit = result["modules"][module]["commit"]
        beyond = s.get("killed_beyond_budget", 0)  # files from before it was counted: none
        killed = f"{s['killed']} ({beyond} beyond the budget)" if beyond else s["killed"]
        cells = (f"`{module}`", s["checked"], s["unchecked"], killed, s["equivalent"], survived, score, commit)
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    if any(s.get("killed_beyond_budget") for s in result["scores"].values()):
        lines += [
            "",
            "Beyond the budget: mutants that survived it and were then killed by a run of every test covering them "
            "(`python -m bench.mutation --beyond-budget MUTANT ...`), named in the JSON.",
        ]
    exempt = result.get("exempt", {})
    if exempt:
        lines += ["", f"Lines exempt from mutation (`# pragma: no mutate`; why, in a comment at each): {', '.join(exempt)}."]
    return "\n".join(lines)


def _budget(result: dict) -> str:
    budget = result.get("test_budget_s")  # runs from before the budget ran every covering test
    return f", each mutant against its covering tests cheapest first, up to {budget:g} s of them" if budget else ""
