"""End-to-end training on real data (digits, Fashion-MNIST, a real-JPEG tree) and exact resume."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch
from omegaconf import OmegaConf
from torch.utils.flop_counter import FlopCounterMode

from conftest import TINY, make_cfg, run_cli
from turbotrain.core import checkpoint as ckpt_io
from turbotrain.core.checkpoint import load
from turbotrain.core.schema import ConfigError
from turbotrain.data import build_data
from turbotrain.models import build_model
from turbotrain.train import numerics, optim
from turbotrain.train.precision import CPU_BF16_ENV, build_precision
from turbotrain.train.run import train
from turbotrain.train.tracking import METRIC_KEYS, peak_mem_mb, process_age_s

CPU = torch.device("cpu")


def test_digits_learns_and_writes_contracts(tmp_path):
    cfg = make_cfg(*TINY, "trainer.max_epochs=3")
    started, age = time.time(), process_age_s()
    best = train(cfg, tmp_path)
    assert best > 0.6  # chance is 0.1
    events = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert {e["split"] for e in events} == {"train", "val"}
    for e in events:
        assert set(METRIC_KEYS) - {"acc5"} <= set(e)
    assert all("acc5" in e for e in events if e["split"] == "val")
    _check_summary(json.loads((tmp_path / "summary.json").read_text()), cfg, tmp_path, events, started, age)
    for name in ("best", "last"):
        ckpt = load(tmp_path / "checkpoints" / f"{name}.pt")  # weights_only=True inside
        assert ckpt["arch"]["num_classes"] == 10 and "trainer:" in ckpt["config"]
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.suffix != ".pt"]


def _check_summary(summary: dict, cfg, run_dir, events: list[dict], started: float, age: float) -> None:
    """Each of summary.json's figures against where it comes from: the checkpoint, the metrics
    log, the config, the model rebuilt, this process."""
    last = load(run_dir / "checkpoints" / "last.pt")
    state, val = last["state"], [e for e in events if e["split"] == "val"]
    assert json.loads(json.dumps(state)) == state  # plain counters, as CONTRACTS.md lists (no device tensor)
    assert summary["best_val_acc1"] == max(e["acc1"] for e in val) > val[-1]["acc1"] - 1e-12
    assert {k: summary[f"val_{k}"] for k in ("loss", "acc1", "acc5")} == {k: val[-1][k] for k in ("loss", "acc1", "acc5")}
    assert summary["val_acc1"] == last["metrics"]["val_acc1"]
    data = build_data(cfg.data)
    batches = len(data.train) // cfg.data.batch_size  # the default sampler drops the last partial batch
    assert (summary["epochs"], summary["steps"]) == (3, 3 * batches) == (state["epoch"], state["global_step"])
    assert (summary["skipped_steps"], summary["bad_samples"], summary["bad_samples_indexed"], summary["restarts"]) == (0, 0, 0, 0)
    assert summary["parent"] is None and summary["world_size"] == 1 and summary["device"] == "cpu"
    assert summary["train_time_s"] == state["train_time_s"]
    # one session from the start: its seconds are the run's training seconds
    assert summary["samples_per_s"] == pytest.approx(3 * batches * cfg.data.batch_size / summary["train_time_s"], rel=1e-6)
    seconds = [batches * cfg.data.batch_size / e["samples_per_s"] for e in val]  # each epoch's, from its rate
    assert len(val) == 3 and sum(seconds) == pytest.approx(summary["train_time_s"], rel=1e-6)
    waits = [e["data_wait_frac"] * s for e, s in zip(val, seconds, strict=True)]
    assert summary["data_wait_frac"] == pytest.approx(sum(waits) / sum(seconds), rel=1e-6) and max(waits) > 0
    assert summary["rank_peak_mem_mb"] == [summary["peak_mem_mb"]] and 0 < summary["peak_mem_mb"] <= peak_mem_mb(CPU)
    assert len(summary["rank_epoch_time_s"]) == 1 and 0 < summary["rank_epoch_time_s"][0] < summary["train_time_s"]
    assert age < summary["time_to_first_step_s"] < process_age_s()  # this process's age at the first step
    startup = summary["startup_s"]  # where the seconds before it went, phase by phase
    assert list(startup) == [
        "python, imports, config, run dir",
        "data, model",
        "initial weights (whitening fit, checkpoint)",
        "loaders, compression, autotune, optimizer",
        "first step (its batch, kernels)",
    ]
    assert sum(startup.values()) == pytest.approx(summary["time_to_first_step_s"], abs=0.005)
    assert startup["python, imports, config, run dir"] > age  # from the process's start to build(): past the age before train()
    model = build_model(cfg.model, data.num_classes, data.in_channels)
    assert summary["params"] == sum(p.numel() for p in model.parameters())
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model.eval()(torch.zeros(1, data.in_channels, data.image_size, data.image_size))
    assert summary["flops"] == counter.get_total_flops() > 0
    precision = build_precision(cfg.precision, CPU)
    assert summary["precision"] == cfg.precision.name == precision.name
    assert summary["autocast_dtype"] == (None if precision.dtype is None else str(precision.dtype).removeprefix("torch."))
    assert summary["compression"] is None and summary["autotune"] is None
    effective = (cfg.loader.num_workers, cfg.trainer.channels_last, cfg.trainer.compile)
    assert (summary["num_workers"], summary["channels_last"], summary["compile"]) == effective
    assert summary["threads"] == torch.get_num_threads() and summary["torch"] == torch.__version__
    finished = time.mktime(time.strptime(summary["finished_at"], "%Y-%m-%dT%H:%M:%S"))
    assert started - 1 <= finished <= time.time()
    assert summary["best_checkpoint"] == str(run_dir / "checkpoints" / "best.pt")


class Interrupted(Exception):
    pass


def interrupt_after_save(monkeypatch, when):
    """Simulate a kill right after a checkpoint for which `when(ckpt)` holds was written."""
    real_save = ckpt_io.atomic_save

    def save(obj, path):
        real_save(obj, path)
        if when(obj):
            raise Interrupted

    monkeypatch.setattr(ckpt_io, "atomic_save", save)


def assert_same_run(a_dir, b_dir):
    a = load(a_dir / "checkpoints" / "last.pt")
    b = load(b_dir / "checkpoints" / "last.pt")
    assert a["metrics"] == b["metrics"]
    assert a["state"]["global_step"] == b["state"]["global_step"]
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k


@pytest.mark.cpu_path
def test_resume_after_epoch_equals_uninterrupted(tmp_path, monkeypatch):
    train(make_cfg(*TINY, "trainer.max_epochs=2"), tmp_path / "full")
    with monkeypatch.context() as m:
        interrupt_after_save(m, lambda c: c["state"]["epoch"] == 1)
        with pytest.raises(Interrupted):
            train(make_cfg(*TINY, "trainer.max_epochs=2"), tmp_path / "split")
    train(make_cfg(*TINY, "trainer.max_epochs=2", "trainer.resume=auto"), tmp_path / "split")
    assert_same_run(tmp_path / "full", tmp_path / "split")


@pytest.mark.cpu_path
def test_a_resume_keeps_the_runs_own_choices_where_this_process_would_choose_otherwise(tmp_path, monkeypatch, caplog):
    """optim.kernel=auto times SGD's two CPU kernels in each process (which differ in the last bit
    of a vector's tail on AVX2 and AVX-512), amp's CPU path follows the CPU's bf16 units, and the
    thread count (which splits reductions) is torch's: a resumed process that would pick each the
    other way keeps the run's, recorded in its checkpoint's config, and equals the uninterrupted run."""
    other_threads = 1 if numerics.PROCESS_THREADS > 1 else 2
    common = (*TINY, "trainer.max_epochs=2")
    monkeypatch.setenv(CPU_BF16_ENV, "1")
    train(make_cfg(*common, "optim.kernel=foreach"), tmp_path / "full")
    with monkeypatch.context() as m:
        m.setattr(optim, "_fused_faster", lambda *a: False)  # this process's timing picks foreach
        interrupt_after_save(m, lambda c: c["state"]["epoch"] == 1)
        with pytest.raises(Interrupted):
            train(make_cfg(*common), tmp_path / "split")
    saved = OmegaConf.create(load(tmp_path / "split" / "checkpoints" / "last.pt")["config"])
    assert (saved.optim.kernel, saved.precision.cpu_bf16, saved.trainer.threads) == ("foreach", True, numerics.PROCESS_THREADS)
    monkeypatch.setattr(optim, "_fused_faster", lambda *a: True)  # the resumed process's own picks, each the other one
    monkeypatch.setenv(CPU_BF16_ENV, "0")
    monkeypatch.setattr(numerics, "PROCESS_THREADS", other_threads)
    with caplog.at_level("INFO", logger="turbotrain"):
        train(make_cfg(*common, "trainer.resume=auto"), tmp_path / "split")
    kept = f"optim.kernel=foreach, precision.cpu_bf16=true, trainer.threads={saved.trainer.threads}, as the run chose"
    assert kept in caplog.text and "another platform" not in caplog.text
    assert_same_run(tmp_path / "full", tmp_path / "split")
    changed = ("trainer.max_epochs=3", "trainer.resume=auto", "optim.kernel=fused", f"trainer.threads={other_threads}")
    with pytest.raises(ConfigError, match=r"optim.kernel: foreach -> fused; trainer.threads: \d+ -> \d+\)"):
        train(make_cfg(*common, *changed), tmp_path / "split")  # typed, another value is a change


def test_a_resume_on_another_platform_says_it_is_not_bit_exact(tmp_path, caplog):
    """The CPU's vector path, instruction sets, device and torch build are no one's choice: a
    checkpoint records them, and a resume where one differs says so in one line."""
    common = (*TINY, "trainer.limit_train_batches=2")
    train(make_cfg(*common, "trainer.max_epochs=1"), tmp_path)
    path = tmp_path / "checkpoints" / "last.pt"
    ckpt = load(path)
    assert ckpt["platform"] == numerics.platform(torch.device("cpu"))
    ckpt["platform"]["cpu_capability"] = "ZVECTOR"  # as if written on an s390x
    torch.save(ckpt, path)
    with caplog.at_level("WARNING", logger="turbotrain"):
        train(make_cfg(*common, "trainer.max_epochs=2", "trainer.resume=auto"), tmp_path)
    (line,) = [r.getMessage() for r in caplog.records if "another platform" in r.getMessage()]
    here = torch.backends.cpu.get_cpu_capability()
    assert f"resuming on another platform (cpu_capability ZVECTOR -> {here}): " in line and "\n" not in line


@pytest.mark.cpu_path
def test_resume_mid_epoch_from_step_checkpoint(tmp_path, monkeypatch):
    common = (*TINY, "trainer.max_epochs=2", "trainer.checkpoint_every_n_steps=5")
    train(make_cfg(*common), tmp_path / "full")
    with monkeypatch.context() as m:
        interrupt_after_save(m, lambda c: c["state"]["global_step"] == 30)
        with pytest.raises(Interrupted):
            train(make_cfg(*common), tmp_path / "split")
    assert load(tmp_path / "split" / "checkpoints" / "last.pt")["state"]["batch_in_epoch"] == 8
    train(make_cfg(*common, "trainer.resume=auto"), tmp_path / "split")
    assert_same_run(tmp_path / "full", tmp_path / "split")


@pytest.mark.cpu_path
def test_worker_processes_give_the_in_process_numbers_and_resume_exactly(tmp_path, monkeypatch):
    """A batch's augmentation comes from (seed, epoch, rank, its samples), wherever it is fetched:
    persistent workers give the numbers of no workers, and a resume with them mid-way through
    the second epoch (fresh workers, where the uninterrupted run's have drawn since epoch 0)
    equals the uninterrupted run."""
    common = (
        *TINY,
        "trainer.max_epochs=2",
        "trainer.limit_train_batches=6",
        "trainer.checkpoint_every_n_steps=3",
        "data.augment=[{name:RandomHorizontalFlip}]",
    )
    workers = ("loader.num_workers=2", "loader.persistent_workers=true")
    train(make_cfg(*common), tmp_path / "in_process")
    train(make_cfg(*common, *workers), tmp_path / "full")
    assert_same_run(tmp_path / "in_process", tmp_path / "full")
    with monkeypatch.context() as m:
        interrupt_after_save(m, lambda c: c["state"]["global_step"] == 9)
        with pytest.raises(Interrupted):
            train(make_cfg(*common, *workers), tmp_path / "split")
    train(make_cfg(*common, *workers, "trainer.resume=auto"), tmp_path / "split")
    assert_same_run(tmp_path / "full", tmp_path / "split")


def test_fashion_mnist_short_run_beats_chance(tmp_path):
    cfg = make_cfg(
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=120",
        "trainer.limit_val_batches=10",
        "trainer.progress_bar=false",
    )
    assert train(cfg, tmp_path) > 0.6  # chance is 0.1


def test_imagenet_tree_of_real_jpegs_learns(jpeg_tree, tmp_path):
    cfg = make_cfg(
        "data=imagenet",
        f"data.root={jpeg_tree}",
        "data.image_size=64",
        "data.batch_size=16",
        "model=small_cnn",
        "trainer.max_epochs=6",
        "trainer.progress_bar=false",
        "sched.warmup_steps=5",
        "optim.lr=0.05",
    )
    assert train(cfg, tmp_path) >= 0.75  # 2 classes: chance is 0.5


@pytest.mark.slow  # ~13 s: data=imagenet also trains in-process above, and through its cache in test_cache.py
def test_cli_imagenet_resnet18_one_epoch(jpeg_tree, tmp_path):
    run_dir = tmp_path / "run"
    r = run_cli(
        "train.py",
        "data=imagenet",
        f"data.root={jpeg_tree}",
        "model=resnet18",
        "trainer.max_epochs=1",
        "data.image_size=64",
        "trainer.progress_bar=false",
        f"hydra.run.dir={run_dir}",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert json.loads((run_dir / "summary.json").read_text())["epochs"] == 1
    assert (run_dir / "checkpoints" / "best.pt").is_file()
    assert (run_dir / "train.log").is_file()


def _cyclic(k: int, half: int = 5, low: float = 0.1) -> float:
    x = abs(k / half - 2 * math.floor(1 + k / (2 * half)) + 1)  # the triangular policy's phase
    return low + (1 - low) * max(0.0, 1 - x)


# sched overrides -> LR / peak LR at optimizer step k of a 20-step run (10 steps an epoch), in
# closed form: the run's scheduler must give these values.
LR_CURVES = {
    "warm-up cosine": (
        ["sched=cosine", "sched.warmup_steps=5", "sched.min_lr_ratio=0.0"],
        lambda k: (k + 1) / 5 if k < 5 else 0.5 * (1 + math.cos(math.pi * (k - 5) / 15)),
    ),
    "step": (["sched=step", "sched.step_epochs=1", "sched.gamma=0.1"], lambda k: 0.1 ** (k // 10)),
    "cyclic": (["sched=cyclic", "sched.cycle_epochs=1", "sched.base_lr_ratio=0.1"], _cyclic),
    "exponential": (["sched=exponential", "sched.gamma=0.5"], lambda k: 0.5 ** (k / 10)),
    "none": (["sched=none"], lambda k: 1.0),
}


@pytest.mark.parametrize("name", list(LR_CURVES))
def test_lr_follows_the_schedule_and_its_state_is_saved(name, tmp_path):
    overrides, curve = LR_CURVES[name]
    common = (*TINY, *overrides, "trainer.limit_train_batches=10", "trainer.log_every_n_steps=1")
    cfg = make_cfg(*common, "trainer.max_epochs=2")
    train(cfg, tmp_path)
    events = [e for e in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines()) if e["split"] == "train"]
    # a train event at step k (k steps done) logs the LR the next step, k, will use
    got = {e["step"]: e["lr"] for e in events if e["step"] < 20}
    assert len(got) == 19
    for k, lr in got.items():
        assert lr == pytest.approx(cfg.optim.lr * curve(k), rel=1e-6, abs=1e-12), (name, k)
    state = load(tmp_path / "checkpoints" / "last.pt")["scheduler"]
    assert (state is None) == (name == "none") and (state is None or state["last_epoch"] == 20)


def test_profiler_writes_trace_and_top_ops(tmp_path):
    train(make_cfg(*TINY, "profiler=torch", "profiler.wait=1", "profiler.active=3", "trainer.max_epochs=1"), tmp_path)
    out = tmp_path / "profiler"
    assert json.loads((out / "trace.json").read_text())["traceEvents"]
    assert "aten::" in (out / "top_ops.txt").read_text()
    assert list((out / "tb").glob("*.pt.trace.json"))


def test_no_profiler_no_files(tmp_path):
    train(make_cfg(*TINY, "trainer.max_epochs=1", "trainer.limit_train_batches=3"), tmp_path)
    assert not (tmp_path / "profiler").exists()


def test_custom_augmentation_list_runs_inside_training(tmp_path):
    """A user's augmentation list (torchvision v2 ops by name, and random_choice) reaches the
    training batches: the run trains, and its weights differ from the same run without it."""
    augment = (
        "data.augment=[{name: RandomHorizontalFlip, p: 1.0},"
        " {name: random_choice, ops: [{name: RandomRotation, degrees: 30}, {name: GaussianBlur, kernel_size: 3}]}]"
    )
    common = (*TINY, "trainer.max_epochs=1", "trainer.limit_train_batches=6")
    train(make_cfg(*common, "data.augment=[]"), tmp_path / "plain")
    train(make_cfg(*common, augment), tmp_path / "augmented")
    plain = load(tmp_path / "plain" / "checkpoints" / "last.pt")
    augmented = load(tmp_path / "augmented" / "checkpoints" / "last.pt")
    assert augmented["state"]["global_step"] == plain["state"]["global_step"] == 6
    assert "RandomHorizontalFlip" in augmented["config"] and "GaussianBlur" in augmented["config"]
    assert any(not torch.equal(v, plain["model"][k]) for k, v in augmented["model"].items() if v.is_floating_point())


def test_a_jobs_thread_count_does_not_leak_into_the_next_one(tmp_path):
    """A sequential sweep runs its jobs in one process: trainer.threads of one job is not the
    next job's (which asked for torch's default)."""
    from turbotrain.train.numerics import PROCESS_THREADS

    train(make_cfg(*TINY, "trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.threads=1"), tmp_path / "a")
    train(make_cfg(*TINY, "trainer.max_epochs=1", "trainer.limit_train_batches=2"), tmp_path / "b")
    threads = [json.loads((tmp_path / r / "summary.json").read_text())["threads"] for r in ("a", "b")]
    assert threads == [1, PROCESS_THREADS]


def test_validating_every_second_epoch_trains_the_same_weights_and_still_validates_at_the_end(tmp_path):
    train(make_cfg(*TINY, "trainer.max_epochs=3"), tmp_path / "every")
    train(make_cfg(*TINY, "trainer.max_epochs=3", "trainer.val_every_n_epochs=2"), tmp_path / "second")
    a, b = (load(tmp_path / d / "checkpoints" / "last.pt") for d in ("every", "second"))
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    vals = [json.loads(line) for line in (tmp_path / "second" / "metrics.jsonl").read_text().splitlines()]
    assert [e["epoch"] for e in vals if e["split"] == "val"] == [1, 2]  # the second epoch, and the last
    assert a["metrics"] == b["metrics"] and b["state"]["epoch"] == 3


def test_the_best_epoch_not_the_last_is_the_runs_best(tmp_path, monkeypatch):
    """Validation scripted to 0.9 then 0.5: train(), summary.json and best.pt all keep the 0.9
    epoch (a run whose last epoch is its best cannot tell best from last)."""
    from turbotrain.train import session

    real, scripted = session.evaluate, iter([0.9, 0.5])

    def evaluate(model, loader, **kwargs):
        return {**real(model, loader, **kwargs), "acc1": next(scripted)}

    monkeypatch.setattr(session, "evaluate", evaluate)
    assert train(make_cfg(*TINY, "trainer.max_epochs=2", "trainer.limit_train_batches=2"), tmp_path) == 0.9
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["best_val_acc1"], summary["val_acc1"]) == (0.9, 0.5)
    best, last = load(tmp_path / "checkpoints" / "best.pt"), load(tmp_path / "checkpoints" / "last.pt")
    assert (best["state"]["epoch"], best["metrics"]["val_acc1"]) == (1, 0.9)
    assert (last["state"]["epoch"], last["metrics"]["val_acc1"]) == (2, 0.5)


def test_startup_phases_are_the_gaps_between_the_ages_each_part_ended_at():
    from turbotrain.train.summary import startup_phases

    ended = {"imports": 1.5, "data": 4.0, "model": 4.25}
    first = "first step (its batch, kernels)"
    assert startup_phases(ended, 5.0) == {"imports": 1.5, "data": 2.5, "model": 0.25, first: 0.75}
    assert startup_phases(ended, None) == {"imports": 1.5, "data": 2.5, "model": 0.25}
    assert startup_phases({"imports": 0.12345, "data": 0.2}, None) == {"imports": 0.123, "data": 0.077}
