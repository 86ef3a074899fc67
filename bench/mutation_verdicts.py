"""Each mutant's verdict, carried in bench/results/mutation.json so that a run on another machine
(a fresh work tree) continues where the last one stopped: a whole run takes longer than most
sessions on a 2-core machine. mutmut keeps the verdict of every mutant whose function's source
hash is unchanged when it generates the mutants over a results file (`<module>.meta`) it finds,
and checks the rest; `seed` writes that file from the record before mutmut's first run in a tree.

A record is per function: its source hash and the exit codes of its mutants in mutmut's order
(1 killed, 0 survived, 33 no tests, None unchecked, ...), so the JSON stays small."""

from __future__ import annotations

import json
from pathlib import Path

from turbotrain.core.atomic import atomic_write_text

MARK = "__mutmut_"  # mutmut's names: <module>.<function>__mutmut_<n>, n from 1


def record(meta: Path) -> dict[str, dict]:
    """function -> {"hash", "exit_codes"} from mutmut's results file of one module."""
    data = json.loads(meta.read_text())
    codes: dict[str, dict[int, int | None]] = {}
    for key, code in data["exit_code_by_key"].items():
        function, _, n = key.rpartition(MARK)
        codes.setdefault(function.rpartition(".")[2], {})[int(n)] = code
    hashes = data["hash_by_function_name"]
    return {f: {"hash": hashes.get(f), "exit_codes": [c.get(n) for n in range(1, max(c) + 1)]} for f, c in sorted(codes.items())}


def seed(meta: Path, module: str, verdicts: dict[str, dict]) -> bool:
    """Write mutmut's results file for `module` (src/turbotrain/...py) from a record, unless the
    tree has its own; True when written."""
    if meta.is_file() or not verdicts:
        return False
    prefix = module.removeprefix("src/").removesuffix(".py").replace("/", ".")
    codes = {f"{prefix}.{f}{MARK}{n}": c for f, v in verdicts.items() for n, c in enumerate(v["exit_codes"], 1)}
    hashes = {f: v["hash"] for f, v in verdicts.items() if v["hash"] is not None}
    meta.parent.mkdir(parents=True, exist_ok=True)
    empty = {"type_check_error_by_key": {}, "durations_by_key": {}, "estimated_durations_by_key": {}}
    atomic_write_text(meta, json.dumps({"exit_code_by_key": codes, "hash_by_function_name": hashes, **empty}))
    return True


def seed_tree(work: Path, recorded: dict, modules: list[str]) -> None:
    """A fresh work tree starts from the verdicts `recorded` (mutation.json) carries for `modules`."""
    for module in modules:
        verdicts = recorded.get("modules", {}).get(module.removeprefix("src/turbotrain/"), {}).get("verdicts", {})
        if seed(work / "mutants" / f"{module}.meta", module, verdicts):
            print(f"bench mutation: {module} continues from the verdicts in mutation.json", flush=True)
