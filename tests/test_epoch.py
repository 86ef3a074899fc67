"""One call of train_one_epoch seen from outside the loop: the progress bar a terminal shows for a
resumed epoch, and the gradients' memory freed between steps."""

from __future__ import annotations

from conftest import make_cfg
from test_loop import _data, _mlp, _run
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


def test_no_bar_where_stderr_is_no_terminal(tmp_path, capsys):
    _resumed_epoch(tmp_path, lambda model: None, bar=False)
    assert capsys.readouterr().err == ""


def test_gradients_are_freed_after_each_step(tmp_path):
    """set_to_none: between steps no parameter holds a gradient (its memory is the forward's)."""
    seen = []
    _resumed_epoch(tmp_path, lambda model: seen.append([p.grad for p in model.parameters()]), bar=False)
    assert len(seen) == 2 and all(g is None for grads in seen for g in grads)
