"""Skipping a step with non-finite losses or gradients without reading the device each step: the
flag goes into the fused optimizer's kernel (as GradScaler's inf check does) and the counts are
read at log steps. Host reads are counted where they happen, in the loop's own code."""

from __future__ import annotations

import functools
import sys
import threading
from pathlib import Path

import pytest
import torch

from conftest import make_cfg
from test_loop import _data, _mlp, _run
from turbotrain.train.loop import TrainState

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "turbotrain"
assert (PACKAGE / "train" / "loop.py").is_file()  # the spy below watches this package's files

# what a CUDA run of each optimizer takes: SGD's fused kernel (optim.kernel=auto resolves to it
# off the CPU, test below); Adam, AdamW and Adagrad are always fused
ON_THE_GPU_PATH = [("sgd", ("optim.kernel=fused",)), ("adam", ()), ("adamw", ()), ("adagrad", ())]


def _host_reads_from_the_package(monkeypatch) -> list[str]:
    """Every bool()/item()/tolist() of a tensor called from any file of turbotrain, by name."""
    reads: list[str] = []
    for name in ("__bool__", "item", "tolist"):
        real = getattr(torch.Tensor, name)

        def spy(self, *args, _real=real, _name=name):
            if sys._getframe(1).f_code.co_filename.startswith(str(PACKAGE)):
                reads.append(_name)
            return _real(self, *args)

        monkeypatch.setattr(torch.Tensor, name, spy)
    return reads


def _reads_for(monkeypatch, tmp_path, optim: str, overrides: tuple) -> list[int]:
    """Host reads for 4 and for 16 steps between the same two log points (none but the epoch's end)."""
    reads = _host_reads_from_the_package(monkeypatch)
    counts = []
    for n in (32, 128):
        x, y = _data(n)
        reads.clear()
        _run(_mlp(), x, y, batch_size=8, accum=1, tmp_path=tmp_path, log_every=10**6, overrides=overrides, optim=optim)
        counts.append(len(reads))
    return counts


@pytest.mark.parametrize("on_nan", ["skip", "stop"])
@pytest.mark.parametrize("check", ["loss", "grads"])
@pytest.mark.parametrize(("optim", "kernel"), ON_THE_GPU_PATH)
def test_host_reads_do_not_grow_with_the_steps(optim, kernel, check, on_nan, monkeypatch, tmp_path):
    """4 steps and 16 steps between two log points read the device equally often: no read per
    step. The epoch's end reads (the skip count), so the spy must see something."""
    counts = _reads_for(monkeypatch, tmp_path, optim, (*kernel, f"trainer.nan_check={check}", f"trainer.on_nan={on_nan}"))
    assert counts[0] > 0, "the spy saw no read at all: it no longer watches the loop's files"
    assert counts[0] == counts[1], counts


def test_rmsprop_reads_the_skip_flag_every_step(monkeypatch, tmp_path):
    """RMSprop has no fused kernel: skipping reads its flag each step (on a GPU too; it warns)."""
    counts = _reads_for(monkeypatch, tmp_path, "rmsprop", ())
    assert counts[1] - counts[0] == 12, counts  # one read per step


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_rmsprop_warns_of_its_per_step_read_only_off_the_cpu(device, caplog):
    """On a CPU the read costs nothing; elsewhere (meta stands in for a GPU: any device but the
    host's) the user is told once, at build time."""
    from turbotrain.train.optim import build_optimizer

    with caplog.at_level("WARNING", logger="turbotrain"):
        build_optimizer(torch.nn.Linear(3, 2, device=device), make_cfg("optim=rmsprop").optim)
    warned = ["optim=rmsprop has no fused kernel: skipping a non-finite step reads the device every step"]
    assert [r.getMessage() for r in caplog.records] == (warned if device == "meta" else [])


def test_auto_kernel_is_fused_for_a_gpu_run_without_timing_on_the_host():
    """numerics.resolve runs before the model is placed: a CUDA run must not time the host's SGD."""
    from turbotrain.train import numerics, optim

    cfg = make_cfg("optim=sgd", "optim.kernel=auto")
    model = torch.nn.Linear(7, 5)  # shapes no other test times
    before = optim._fused_faster.cache_info()
    numerics.resolve(cfg, model, torch.device("cuda"), agree=lambda v: v, ckpt=None)
    assert cfg.optim.kernel == "fused"
    assert optim._fused_faster.cache_info() == before  # nothing timed


def test_a_skipped_first_step_leaves_no_trace(tmp_path):
    """The fused SGD kernel starts its momentum on the first step; a first step skipped in the kernel
    must leave the run equal to one that never saw that batch."""
    x, y = _data(40)
    x[0, 0] = float("nan")  # the first batch of 8 is skipped
    skipped, clean = _mlp(), _mlp()
    state = _run(skipped, x, y, batch_size=8, accum=1, tmp_path=tmp_path)
    _run(clean, x[8:], y[8:], batch_size=8, accum=1, tmp_path=tmp_path)
    assert state.skipped_steps == 1 and state.global_step == 5
    for a, b in zip(skipped.parameters(), clean.parameters(), strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize(("log_every", "stop"), [(1, 3), (2, 4), (10**6, 8)])
def test_patience_is_counted_across_log_points(log_every, stop, tmp_path):
    """Consecutive skips are counted on the device between reads, a streak across reads too: with
    nan_patience=3 and every loss NaN the run stops at the first read after the third skip."""
    from turbotrain.train.loop import Diverged

    x, y = _data(64)
    x[:, 0] = float("nan")
    overrides = ("trainer.nan_patience=3",)
    with pytest.raises(Diverged, match=rf"^3 consecutive steps skipped .* at step {stop}$"):
        _run(_mlp(), x, y, batch_size=8, accum=1, tmp_path=tmp_path, log_every=log_every, overrides=overrides)


def test_skip_counts_are_the_total_and_the_longest_streak_since_the_last_read():
    state = TrainState(nan_streak=2)  # a resumed run in a streak of 2
    for skipped in (1, 0, 1, 1, 1, 0, 1):
        state.count_skip(torch.tensor(float(skipped)))
    assert (state.read_skips(), state.skipped_steps, state.nan_streak) == (3, 5, 1)
    for skipped in (1, 1):
        state.count_skip(torch.tensor(float(skipped)))
    assert (state.read_skips(), state.skipped_steps, state.nan_streak) == (3, 7, 3)  # the streak went on across the read
    assert (state.read_skips(), state.skipped_steps) == (3, 7)  # nothing new: the current streak


@pytest.mark.parametrize("kernel", [{"fused": True}, {"foreach": True}, {"foreach": False}])
@pytest.mark.parametrize("optimizer", [torch.optim.SGD, torch.optim.AdamW])
def test_step_unless_is_the_optimizers_step_or_a_step_never_taken(optimizer, kernel):
    """With the flag clear, step_unless is optimizer.step(); with it set, the run goes on as if
    that step's gradients had never come (fused kernels take the flag, the others read it)."""
    from turbotrain.train.loop import step_unless

    extra = {"momentum": 0.9} if optimizer is torch.optim.SGD else {}
    models = [_mlp() for _ in range(4)]
    plain, unless, skipping, without = (optimizer(m.parameters(), lr=0.1, **extra, **kernel) for m in models)
    for step in range(3):
        x, y = _data(8, seed=step)
        for m in models:
            torch.nn.functional.cross_entropy(m(x), y).backward()
        plain.step()
        step_unless(unless, torch.tensor(0.0))
        step_unless(skipping, torch.tensor(float(step == 1)))
        if step != 1:
            without.step()
        for o in (plain, unless, skipping, without):
            o.zero_grad()
    for a, b in ((models[0], models[1]), (models[2], models[3])):
        for p, q in zip(a.parameters(), b.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=0, atol=0)
    assert not torch.equal(models[0][0].weight, models[2][0].weight)  # the skip changed something


@pytest.mark.parametrize("bad_step", [0, 1])
def test_on_nan_stop_names_the_first_bad_step_after_later_good_ones(bad_step, tmp_path):
    """One non-finite loss at step 0 or 1 of 4, read at the epoch's end: the run stops there,
    naming that step and its loss, though the steps after it were finite."""
    from turbotrain.train.loop import Diverged

    x, y = _data(32)
    x[8 * bad_step, 0] = float("nan")
    with pytest.raises(Diverged, match=rf"^loss is nan at step {bad_step}$"):
        _run(_mlp(), x, y, batch_size=8, accum=1, tmp_path=tmp_path, log_every=10**6, overrides=("trainer.on_nan=stop",))


def _summed_over_two_threads():
    """reduce(t, rank): `t` summed over two threads, in place, as DDP's all-reduce sums over ranks."""
    barrier, slots = threading.Barrier(2, timeout=60), {}

    def reduce(t: torch.Tensor, rank: int) -> torch.Tensor:
        slots[rank] = t.clone()
        barrier.wait()
        total = slots[0] + slots[1]
        barrier.wait()  # both have read the slots before either writes the next
        return t.copy_(total)

    return reduce


def _two_ranks(tmp_path, monkeypatch, *overrides: str) -> dict:
    """An epoch of 4 steps on two threads standing in for DDP ranks (their flags summed as DDP's
    all-reduce would), rank 1's step 1 with a NaN loss: per rank, its state or why it stopped."""
    import test_loop
    from turbotrain.train.loop import Diverged

    reduce, out, lock = _summed_over_two_threads(), {}, threading.Lock()
    compose = test_loop.make_cfg

    def make_cfg_alone(*overrides):  # Hydra's composition is one global state: one thread at a time
        with lock:
            return compose(*overrides)

    monkeypatch.setattr(test_loop, "make_cfg", make_cfg_alone)

    def rank(r: int) -> None:
        x, y = _data(32)
        if r == 1:
            x[8, 0] = float("nan")
        try:
            out[r] = _run(
                _mlp(),
                x,
                y,
                batch_size=8,
                accum=1,
                tmp_path=tmp_path / str(r),
                log_every=10**6,
                overrides=overrides,
                reduce=functools.partial(reduce, rank=r),
            )
        except Diverged as e:
            out[r] = str(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_on_nan_stop_stops_every_rank_and_each_names_what_it_saw(tmp_path, monkeypatch):
    """Both stop at the epoch's end; rank 1 names its step and loss, rank 0 the other rank (its own
    losses were finite)."""
    stopped = _two_ranks(tmp_path, monkeypatch, "trainer.on_nan=stop")
    assert stopped == {0: "another rank's loss was not finite at step 4", 1: "loss is nan at step 1"}


def test_one_ranks_non_finite_loss_skips_that_step_on_every_rank(tmp_path, monkeypatch):
    """DDP's ranks must take the same steps: rank 0's losses were finite, yet it skips step 1 too."""
    states = _two_ranks(tmp_path, monkeypatch, "trainer.on_nan=skip")
    assert [(s.skipped_steps, s.global_step) for s in (states[0], states[1])] == [(1, 4), (1, 4)]
