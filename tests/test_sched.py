"""Every schedule's learning rate, step by step, against values worked out by hand from its
definition (or, for torch's own OneCycleLR, the library built with the same arguments)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from conftest import make_cfg
from turbotrain.train.optim import build_optimizer
from turbotrain.train.sched import build_scheduler


def _rates(overrides, steps, total_steps, steps_per_epoch, optim="sgd"):
    """The learning rate (one per step, every group agreeing) and the optimizer at each step."""
    cfg = make_cfg(f"optim={optim}", *overrides)
    opt = build_optimizer(nn.Linear(3, 2), cfg.optim)
    sched = build_scheduler(opt, cfg.sched, cfg.optim, total_steps=total_steps, steps_per_epoch=steps_per_epoch)
    rates, groups = [], []
    for _ in range(steps):
        lrs = {g["lr"] for g in opt.param_groups}
        assert len(lrs) == 1, lrs
        rates.append(lrs.pop())
        groups.append({k: v for k, v in opt.param_groups[0].items() if k != "params"})
        opt.step()
        sched.step()
    return rates, groups


def test_cosine_warms_up_linearly_then_falls_to_its_floor_at_the_last_step():
    lr = 0.2
    rates, _ = _rates(["sched=cosine", "sched.warmup_steps=4", "sched.min_lr_ratio=0.1", f"optim.lr={lr}"], 23, 20, 5)
    assert rates[:5] == pytest.approx([lr / 4, lr / 2, 3 * lr / 4, lr, lr])
    assert rates[12] == pytest.approx(lr * (0.1 + 0.9 / 2))  # half way down the cosine
    assert rates[8] == pytest.approx(lr * (0.1 + 0.9 * (1 + math.cos(math.pi / 4)) / 2))
    assert rates[20:] == pytest.approx([lr * 0.1] * 3)  # past the end: the floor


def test_cosine_shortens_a_warm_up_longer_than_the_run():
    rates, _ = _rates(["sched=cosine", "sched.warmup_steps=100", "optim.lr=1.0"], 5, 5, 5)
    assert rates == pytest.approx([1 / 4, 2 / 4, 3 / 4, 1.0, 1.0])  # warm-up of total - 1 steps, then the peak


@pytest.mark.parametrize(("step_epochs", "steps_per_epoch"), [(1, 1), (2, 1), (1, 3)])
def test_step_decay_multiplies_by_gamma_every_step_epochs(step_epochs, steps_per_epoch):
    overrides = ["sched=step", f"sched.step_epochs={step_epochs}", "sched.gamma=0.5", "optim.lr=1.0"]
    rates, _ = _rates(overrides, 9, 9, steps_per_epoch)
    every = step_epochs * steps_per_epoch
    assert rates == pytest.approx([0.5 ** (s // every) for s in range(9)])


def test_exponential_decays_by_gamma_per_epoch_smoothly():
    rates, _ = _rates(["sched=exponential", "sched.gamma=0.25", "optim.lr=1.0"], 9, 9, 4)
    assert rates[4] == pytest.approx(0.25) and rates[8] == pytest.approx(0.25**2)
    assert rates[2] == pytest.approx(0.5) and rates[1] == pytest.approx(0.25**0.25)


@pytest.mark.parametrize("anneal", ["cos", "linear"])
def test_onecycle_is_torchs_with_the_peak_at_the_learning_rate(anneal):
    overrides = ["sched=onecycle", "sched.pct_start=0.25", f"sched.anneal_strategy={anneal}", "optim.lr=0.4"]
    rates, _ = _rates(overrides, 20, 20, 5)
    reference = torch.optim.SGD(nn.Linear(3, 2).parameters(), lr=0.4, momentum=0.9)
    sched = torch.optim.lr_scheduler.OneCycleLR(reference, max_lr=0.4, total_steps=20, pct_start=0.25, anneal_strategy=anneal)
    expected = []
    for _ in range(20):
        expected.append(reference.param_groups[0]["lr"])
        reference.step()
        sched.step()
    assert rates == pytest.approx(expected)
    assert max(rates) == pytest.approx(0.4) and rates.index(max(rates)) == 4  # 0.25 of 20 steps, counted from 0


def test_cyclic_rises_from_its_base_to_the_peak_in_half_a_cycle_and_cycles_sgds_momentum():
    overrides = ["sched=cyclic", "sched.base_lr_ratio=0.1", "sched.cycle_epochs=2", "optim.lr=1.0", "optim.momentum=0.9"]
    rates, groups = _rates(overrides, 21, 40, 5)
    up = [0.1 + 0.9 * s / 5 for s in range(6)]
    assert rates == pytest.approx(up + up[-2::-1] + up[1:] + up[-2::-1])  # two whole cycles of 10 steps
    assert groups[0]["momentum"] == pytest.approx(0.9) and groups[5]["momentum"] == pytest.approx(0.8)  # inverse of the rate


def test_cyclic_peaks_at_max_lr_when_set_and_leaves_adams_betas_alone():
    overrides = ["sched=cyclic", "sched.base_lr_ratio=0.5", "sched.max_lr=0.5", "sched.cycle_epochs=1", "optim.lr=0.2"]
    rates, groups = _rates(overrides, 5, 40, 4, optim="adam")
    assert rates == pytest.approx([0.1, 0.3, 0.5, 0.3, 0.1])  # base 0.5 * optim.lr, peak sched.max_lr
    assert {tuple(g["betas"]) for g in groups} == {(0.9, 0.999)}


@pytest.mark.parametrize(("warmup", "total"), [(0, 1), (3, 4), (2, 7)])
def test_cosine_ends_at_its_floor_at_the_last_step_however_short_its_decay(warmup, total):
    """Cosine from 1 at the end of the warm-up to min_lr_ratio at `total`, also for a decay of a
    single step (a one-step run, or warm-up up to the last step)."""
    from turbotrain.train.sched import WarmupCosine

    schedule = WarmupCosine(warmup, total, 0.1)
    assert schedule(warmup) == pytest.approx(1.0) and schedule(total) == pytest.approx(0.1)
    mid = warmup + (total - warmup) / 2  # halfway down the cosine: halfway between 1 and the floor
    assert schedule(mid) == pytest.approx(0.55)


def test_continue_schedule_puts_a_fresh_scheduler_at_the_saved_step_and_leaves_it_without_one():
    from turbotrain.train.resume import continue_schedule

    cfg = make_cfg("sched=cosine", "sched.warmup_steps=4", "optim.lr=0.2")
    built = []
    for _ in range(2):
        opt = build_optimizer(nn.Linear(3, 2), cfg.optim)
        built.append((opt, build_scheduler(opt, cfg.sched, cfg.optim, total_steps=20, steps_per_epoch=5)))
    (ran_opt, ran), (fresh_opt, fresh) = built
    for _ in range(7):
        ran_opt.step()
        ran.step()
    continue_schedule(fresh, ran.state_dict())
    assert (fresh.last_epoch, fresh_opt.param_groups[0]["lr"]) == (7, ran_opt.param_groups[0]["lr"])
    continue_schedule(None, ran.state_dict())  # a run without a schedule: nothing to put anywhere
    continue_schedule(fresh, None)  # a checkpoint without one: the fresh schedule stays where it is
    assert (fresh.last_epoch, fresh_opt.param_groups[0]["lr"]) == (7, ran_opt.param_groups[0]["lr"])
