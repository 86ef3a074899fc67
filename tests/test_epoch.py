"""One call of train_one_epoch seen from outside the loop: the progress bar a terminal shows for a
resumed epoch, the gradients' memory freed between steps, its counts, where it stops, what it asks
of DDP and BatchNorm, and what it logs."""

from __future__ import annotations

import contextlib
import json
import re
import resource

import torch
from torch import nn

from conftest import make_cfg
from test_loop import _data, _mlp, _run
from turbotrain.data.safe import collate_skipping_bad
from turbotrain.train.loop import TrainState
from turbotrain.train.tracking import Tracker


def _resumed_epoch(tmp_path, on_step, *, bar: bool) -> TrainState:
    """Epoch 3 of 4 batches resumed after its second: the loader holds the last two batches."""
    x, y = _data(32)
    model = _mlp()
    tracker = Tracker(tmp_path, enabled=False, logger_cfg=make_cfg().logger, config={})
    tracker.progress_bar = bar  # what a terminal's stderr gets
    state = TrainState(epoch=3, batch_in_epoch=2, global_step=2)
    return _run(
        model,
        x[16:],
        y[16:],
        batch_size=8,
        accum=1,
        tmp_path=tmp_path,
        state=state,
        tracker=tracker,
        batches_in_epoch=4,
        on_step=lambda s: on_step(model),
    )


def test_the_bar_of_a_resumed_epoch_counts_on_from_where_it_stopped(tmp_path, capsys):
    state = _resumed_epoch(tmp_path, lambda model: None, bar=True)
    err = capsys.readouterr().err
    assert state.batch_in_epoch == 4
    assert "epoch 3:  75%" in err and "| 3/4 [" in err, err  # drawn at the first step's log line
    assert re.search(r"acc=0\.\d{3}, loss=\d+\.\d{3}, sps=\d+\]", err), err  # the step's figures


def test_no_bar_where_stderr_is_no_terminal(tmp_path, capsys):
    _resumed_epoch(tmp_path, lambda model: None, bar=False)
    assert capsys.readouterr().err == ""


def test_gradients_are_freed_after_each_step(tmp_path):
    """set_to_none: between steps no parameter holds a gradient (its memory is the forward's)."""
    seen = []
    _resumed_epoch(tmp_path, lambda model: seen.append([p.grad for p in model.parameters()]), bar=False)
    assert len(seen) == 2 and all(g is None for grads in seen for g in grads)


def test_an_epoch_adds_its_samples_and_the_dropped_ones_to_a_resumed_count(tmp_path):
    """Batches as collate_skipping_bad makes them (with the count of samples it dropped) and plain
    ones (no count): both add to the counts a checkpoint carried in."""
    x, y = _data(32)
    samples = [(x[i], y[i]) for i in range(32)]
    dropped = (0, 2, 0, 1)
    batches = [collate_skipping_bad(samples[8 * b : 8 * b + 8] + [None] * n) for b, n in enumerate(dropped)]
    carried = {"samples_seen": 16, "bad_samples": 1}  # what a checkpoint brought in
    state = _run(_mlp(), x, y, batch_size=8, accum=1, tmp_path=tmp_path, loader=batches, state=TrainState(**carried))
    assert (state.samples_seen, state.bad_samples) == (16 + 32, 1 + 3)
    plain = _run(_mlp(), x, y, batch_size=8, accum=1, tmp_path=tmp_path, state=TrainState(**carried))
    assert (plain.samples_seen, plain.bad_samples) == (16 + 32, 1)


def test_max_steps_ends_the_epoch_at_that_step(tmp_path):
    x, y = _data(40)
    steps = []
    state = _run(
        _mlp(),
        x,
        y,
        batch_size=8,
        accum=1,
        tmp_path=tmp_path,
        overrides=("trainer.max_steps=3",),
        on_step=lambda s: steps.append(s.global_step),
    )
    assert steps == [1, 2, 3] and state.batch_in_epoch == 3


def test_bn_statistics_stop_at_the_warm_up_step(tmp_path):
    """accum_bn=freeze with 2 warm-up steps of 2 micro-batches: BN's running statistics take those
    4 micro-batches, none after."""
    x, y = _data(40)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    overrides = ("trainer.accum_bn=freeze", "trainer.accum_bn_warmup_steps=2")
    _run(model, x, y, batch_size=4, accum=2, tmp_path=tmp_path, overrides=overrides)
    assert int(model[1].num_batches_tracked) == 4


def test_on_device_transforms_each_batch_before_its_step(tmp_path):
    """A transform on the device (mixing, resolution) is the same as training on its output."""
    x, y = _data(32)
    seen = []

    def negate(inputs, target, step):
        seen.append(step)
        return -inputs, target

    transformed, reference = _mlp(), _mlp()
    _run(transformed, x, y, batch_size=8, accum=1, tmp_path=tmp_path, on_device=negate)
    _run(reference, -x, y, batch_size=8, accum=1, tmp_path=tmp_path)
    assert seen == [0, 1, 2, 3]
    for p, q in zip(transformed.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_ddp_syncs_gradients_on_each_groups_last_micro_batch_only(tmp_path):
    """What the loop asks of DDP: no_sync() around every micro-batch of a group but its last (8
    micro-batches in groups of 3, 3 and 2). The 2-process equivalence test sees the same on real
    ranks; this one runs in the process that mutation testing watches."""
    x, y = _data(32)
    model, forwards, unsynced = _mlp(), [], []
    model.register_forward_pre_hook(lambda module, args: forwards.append(len(forwards)))

    @contextlib.contextmanager
    def no_sync():
        unsynced.append(len(forwards))  # the micro-batch about to run
        yield

    model.no_sync = no_sync
    _run(model, x, y, batch_size=4, accum=3, tmp_path=tmp_path)
    assert len(forwards) == 8 and unsynced == [0, 1, 3, 4, 6]


def test_train_events_name_their_step_epoch_skips_and_memory(tmp_path):
    x, y = _data(32)
    tracker = Tracker(tmp_path, enabled=True, logger_cfg=make_cfg().logger, config={}, progress_bar=False)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    _run(_mlp(), x, y, batch_size=8, accum=1, tmp_path=tmp_path, log_every=2, state=TrainState(epoch=2), tracker=tracker)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    tracker.close()
    events = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    seen = [(e["step"], e["epoch"], e["split"], e["skipped_steps"], e["gpu_util"]) for e in events]
    assert seen == [(2, 2, "train", 0, None), (4, 2, "train", 0, None)]  # no GPU figure on a CPU
    assert all(before <= e["peak_mem_mb"] <= after for e in events)  # the process's high-water mark then
