"""The mutation job's bookkeeping over mutmut's results files (the job itself is bench/mutation.py)."""

import json

from bench import mutation
from bench.mutation_equivalent import EQUIVALENT


def test_a_rerun_tries_survivors_and_unseen_mutants_again_but_not_killed_or_equivalent_ones(tmp_path):
    equivalent = next(k for k in EQUIVALENT if k.startswith("turbotrain.train.loop."))
    module = "src/turbotrain/train/loop.py"
    codes = {"killed": 1, "survived": 0, "no_tests": 33, "unchecked": None, equivalent: 0}
    meta = tmp_path / "mutants" / f"{module}.meta"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"exit_code_by_key": codes, "other": "kept"}))

    left = mutation._forget_survivors(tmp_path, [module, "src/turbotrain/train/ema.py"])  # one without results

    saved = json.loads(meta.read_text())
    assert saved == {"exit_code_by_key": {**codes, "survived": None, "no_tests": None}, "other": "kept"}
    assert sorted(left) == ["no_tests", "survived", "unchecked"]
