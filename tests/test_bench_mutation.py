"""The mutation job's bookkeeping over mutmut's results files (the job itself is bench/mutation.py)."""

import json

from bench import mutation
from bench.mutation_equivalent import EQUIVALENT


def test_a_rerun_tries_survivors_and_unseen_mutants_again_but_not_killed_or_equivalent_ones(tmp_path):
    equivalent = next(k for k in EQUIVALENT if k.startswith("turbotrain.train.loop."))
    module = _real("src/turbotrain/train/loop.py")
    codes = {"killed": 1, "survived": 0, "no_tests": 33, "unchecked": None, equivalent: 0}
    meta = tmp_path / "mutants" / f"{module}.meta"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"exit_code_by_key": codes, "other": "kept"}))

    left = mutation._forget_survivors(tmp_path, [module, "src/turbotrain/train/ema.py"])  # one without results

    saved = json.loads(meta.read_text())
    assert saved == {"exit_code_by_key": {**codes, "survived": None, "no_tests": None}, "other": "kept"}
    assert sorted(left) == ["no_tests", "survived", "unchecked"]


def test_the_tests_of_an_edited_file_are_mapped_again_and_the_others_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(mutation, "TEST_HASHES", tmp_path / "test_hashes.json")
    (tmp_path / "tests").mkdir()
    (tmp_path / "mutants").mkdir()
    for name in ("test_a.py", "test_b.py"):
        (tmp_path / "tests" / name).write_text("def test_x(): pass\n")
    stats = {
        "duration_by_test": {"tests/test_a.py::test_x": 1.0, "tests/test_b.py::test_x": 2.0},
        "tests_by_mangled_function_name": {"m.x_f": ["tests/test_a.py::test_x", "tests/test_b.py::test_x"]},
        "other": "kept",
    }
    path = tmp_path / "mutants" / "mutmut-stats.json"
    path.write_text(json.dumps(stats))

    mutation._forget_changed_tests(tmp_path)  # no earlier run recorded its files: every test is mapped again
    assert json.loads(path.read_text()) == {
        "duration_by_test": {},
        "tests_by_mangled_function_name": {"m.x_f": []},
        "other": "kept",
    }

    path.write_text(json.dumps(stats))  # as mutmut's next stats pass leaves it
    (tmp_path / "tests" / "test_b.py").write_text("def test_x(): assert True\n")
    mutation._forget_changed_tests(tmp_path)
    assert json.loads(path.read_text()) == {
        "duration_by_test": {"tests/test_a.py::test_x": 1.0},
        "tests_by_mangled_function_name": {"m.x_f": ["tests/test_a.py::test_x"]},
        "other": "kept",
    }


def test_kills_beyond_the_budget_are_counted_and_shown_apart(tmp_path):
    from bench.mutation_report import section

    module = {"commit": "abc1234", "status": {"killed": 9, "survived": 1}, "equivalent": {}, "killed_beyond_budget": ["m1", "m2"]}
    result = {"children": 2, "test_budget_s": 30.0, "modules": {"train/run.py": module}}
    result["hardware"] = {"cpu": "AMD EPYC", "isa": ["avx2"], "cores": 2, "gpu": None, "torch": "2.14.1"}
    counts = {"checked": 10, "killed": 9, "killed_beyond_budget": 2, "equivalent": 0, "unchecked": 0, "score": 0.9}
    assert mutation.scores(result) == {"train/run.py": counts}

    def table() -> str:
        (tmp_path / "mutation.json").write_text(json.dumps({**result, "scores": mutation.scores(result)}))
        return section(tmp_path)

    shown = table()
    assert "| `train/run.py` | 10 | 0 | 9 (2 beyond the budget) | 0 | 1 | 90.0 % | abc1234 |" in shown
    assert "Beyond the budget:" in shown
    module["killed_beyond_budget"] = []
    shown = table()
    assert "| `train/run.py` | 10 | 0 | 9 | 0 | 1 | 90.0 % | abc1234 |" in shown and "Beyond the budget" not in shown


def test_verdicts_carried_in_the_json_give_a_fresh_tree_mutmuts_results_file_back(tmp_path):
    from bench.mutation_verdicts import record, seed

    codes = {
        "turbotrain.train.loop.xǁStepǁbackward__mutmut_2": 0,
        "turbotrain.train.loop.xǁStepǁbackward__mutmut_1": 1,
        "turbotrain.train.loop.xǁStepǁbackward__mutmut_3": None,
        "turbotrain.train.loop.x_to_device__mutmut_1": 33,
    }
    hashes = {"xǁStepǁbackward": "aaa", "x_to_device": "bbb"}
    module = _real("src/turbotrain/train/loop.py")
    meta = tmp_path / "old" / "mutants" / f"{module}.meta"  # where mutmut keeps a module's results
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"exit_code_by_key": codes, "hash_by_function_name": hashes, "durations_by_key": {"x": 1.0}}))
    verdicts = json.loads(json.dumps(record(meta)))  # as mutation.json holds them
    assert verdicts == {
        "x_to_device": {"hash": "bbb", "exit_codes": [33]},
        "xǁStepǁbackward": {"hash": "aaa", "exit_codes": [1, 0, None]},
    }

    fresh = tmp_path / "new" / "mutants" / f"{module}.meta"
    assert seed(fresh, module, verdicts)
    written = json.loads(fresh.read_text())
    assert (written["exit_code_by_key"], written["hash_by_function_name"]) == (codes, hashes)
    other = {"x_to_device": {"hash": "ccc", "exit_codes": [1]}}
    assert not seed(fresh, module, other)  # a tree's own results stay
    assert json.loads(fresh.read_text()) == written


def _real(module: str) -> str:
    """A module the job mutates, as it names it: a test of its results files follows a move."""
    assert module in mutation.MODULES and (mutation.ROOT / module).is_file(), module
    return module
