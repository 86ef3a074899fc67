"""Gradient accumulation, BN freezing, precision policy, optimizer groups: against references."""

from __future__ import annotations

import copy
import re
import types

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from conftest import make_cfg
from turbotrain.config import ConfigError
from turbotrain.train.loop import TrainState, train_one_epoch
from turbotrain.train.optim import build_optimizer
from turbotrain.train.precision import CPU_BF16_ENV, build_precision
from turbotrain.train.tracking import Tracker

CPU = torch.device("cpu")


def _data(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 12, generator=g), torch.randint(0, 3, (n,), generator=g)


def _run(model, x, y, *, batch_size, accum, tmp_path, overrides=(), log_every=1, optim="sgd", reduce=None, state=None, **epoch):
    """One train_one_epoch over (x, y), or over `loader` where given; `state` a resumed epoch's (its
    loader then holds the rest, `batches_in_epoch` given), `epoch` its other keywords (on_step, ...)."""
    cfg = make_cfg(f"optim={optim}", "optim.weight_decay=0", "precision=fp32", *overrides)
    cfg.trainer.grad_accum_steps = accum
    cfg.trainer.log_every_n_steps = log_every
    opt = build_optimizer(model, cfg.optim)
    loader = epoch.pop("loader", None) or DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=False)
    state = state or TrainState()
    train_one_epoch(
        model,
        loader,
        opt,
        None,
        build_precision(cfg.precision, CPU),
        state,
        trainer_cfg=cfg.trainer,
        device=CPU,
        tracker=epoch.pop("tracker", None) or Tracker(tmp_path, enabled=False, logger_cfg=cfg.logger, config={}),
        batches_in_epoch=epoch.pop("batches_in_epoch", len(loader)),
        reduce=reduce,
        **epoch,
    )
    return state


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 3))


def test_accumulation_equals_large_batch(tmp_path):
    x, y = _data(32)
    big, acc = _mlp(), _mlp()
    _run(big, x, y, batch_size=32, accum=1, tmp_path=tmp_path)
    state = _run(acc, x, y, batch_size=8, accum=4, tmp_path=tmp_path)
    assert state.global_step == 1
    for a, b in zip(big.parameters(), acc.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_short_last_group_is_scaled_by_its_own_length(tmp_path):
    # 6 micro-batches of 8 with accum 4 -> groups of 4 and 2 == steps on 32 then 16 samples.
    x, y = _data(48)
    ref, acc = _mlp(), _mlp()
    opt = torch.optim.SGD(ref.parameters(), lr=make_cfg("optim=sgd").optim.lr, momentum=0.9, nesterov=True)
    for lo, hi in ((0, 32), (32, 48)):
        nn.functional.cross_entropy(ref(x[lo:hi]), y[lo:hi]).backward()
        opt.step()
        opt.zero_grad()
    state = _run(acc, x, y, batch_size=8, accum=4, tmp_path=tmp_path)
    assert state.global_step == 2
    for a, b in zip(ref.parameters(), acc.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_accum_bn_freeze_stops_running_stats_after_warmup(tmp_path):
    x, y = _data(64)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    bn = model[1]
    overrides = ("trainer.accum_bn=freeze", "trainer.accum_bn_warmup_steps=1")
    frozen_at = {}
    orig_forward = bn.forward

    def spy(inp):
        frozen_at.setdefault(bn.training, bn.running_mean.clone())
        return orig_forward(inp)

    bn.forward = spy
    _run(model, x, y, batch_size=8, accum=2, tmp_path=tmp_path, overrides=overrides)
    assert True in frozen_at and False in frozen_at  # trained, then frozen
    torch.testing.assert_close(bn.running_mean, frozen_at[False])


def test_unfrozen_bn_keeps_updating(tmp_path):
    x, y = _data(64)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    before = copy.deepcopy(model[1].running_mean)
    _run(model, x, y, batch_size=8, accum=2, tmp_path=tmp_path)
    assert not torch.equal(before, model[1].running_mean)


def test_precision_policy_on_cpu(amp_path):
    amp = build_precision(make_cfg("precision=amp").precision, CPU)
    assert amp.dtype is {"bf16": torch.bfloat16, "fp32": None}[amp_path] and amp.scaler is None
    bf16 = build_precision(make_cfg("precision=bf16").precision, CPU)
    assert bf16.dtype is torch.bfloat16 and bf16.scaler is None
    fp16 = build_precision(make_cfg("precision=fp16").precision, CPU)
    assert fp16.dtype is torch.float16 and fp16.scaler is not None
    assert fp16.scaler.get_scale() == 65536.0
    fp32 = build_precision(make_cfg("precision=fp32").precision, CPU)
    assert fp32.dtype is None and fp32.scaler is None
    with bf16.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype is torch.bfloat16


def _written_out(ref, x, y, precision: str, clip: float | None = None):
    """The steps _run takes on batches of 8, written out with torch's own pieces (autocast,
    GradScaler, clip_grad_norm_): the gradient norms clipped, and the scaler."""
    cfg = make_cfg("optim=sgd", "optim.weight_decay=0", f"precision={precision}")
    fp16 = precision == "fp16"
    opt = build_optimizer(ref, cfg.optim)
    scaler = torch.amp.GradScaler("cpu", init_scale=cfg.precision.init_scale if fp16 else 2.0**16, enabled=fp16)
    norms = []
    for lo in range(0, len(x), 8):
        with torch.autocast("cpu", dtype=torch.float16, enabled=fp16):
            loss = nn.functional.cross_entropy(ref(x[lo : lo + 8]).float(), y[lo : lo + 8])
        scaler.scale(loss).backward()
        if clip:
            scaler.unscale_(opt)
            norms.append(float(nn.utils.clip_grad_norm_(ref.parameters(), clip)))
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    return norms, scaler


def test_fp16_steps_are_gradscalers_recipe_and_skip_inf_grads(tmp_path):
    """precision=fp16 trains as torch's own GradScaler recipe does: the loss scaled, the gradients
    unscaled before the step, a step with inf gradients skipped."""
    x, y = _data(32)
    x[0, 0] = float("inf")  # first batch makes inf gradients
    model, ref = _mlp(), _mlp()
    state = _run(model, x, y, batch_size=8, accum=1, tmp_path=tmp_path, overrides=("precision=fp16",))
    _, scaler = _written_out(ref, x, y, "fp16")
    init_scale = make_cfg("precision=fp16").precision.init_scale
    assert (state.skipped_steps, state.global_step, scaler.get_scale()) == (1, 4, init_scale / 2)
    for a, b in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_grad_clip_is_torchs_clip_before_the_step(precision, tmp_path):
    """trainer.grad_clip equals clip_grad_norm_ written out before each step (after GradScaler's
    unscale under fp16); the limit binds on these batches, so an unclipped run differs."""
    x, y = _data(32)
    model, ref = _mlp(), _mlp()
    _run(model, x, y, batch_size=8, accum=1, tmp_path=tmp_path, overrides=(f"precision={precision}", "trainer.grad_clip=0.05"))
    norms, _ = _written_out(ref, x, y, precision, clip=0.05)
    assert min(norms) > 0.05
    for a, b in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_no_weight_decay_on_norm_and_bias():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 2))
    opt = build_optimizer(model, make_cfg("optim=adamw").optim)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] > 0 and no_decay["weight_decay"] == 0
    assert {p.ndim for p in decay["params"]} == {2, 4}
    assert {p.ndim for p in no_decay["params"]} == {1}


def test_dynamic_and_progressive_resolution():
    from turbotrain.data.resolution import Resolution

    cfg = make_cfg("data.resolution=dynamic", "data.resolution_step=8").data
    dyn = Resolution(cfg, nominal=64, total_steps=100, seed=0)
    sizes = {dyn.size(k) for k in range(50)}
    assert len(sizes) > 2 and all(s % 8 == 0 and 48 <= s <= 80 for s in sizes)
    assert [dyn.size(k) for k in range(10)] == [Resolution(cfg, 64, 100, 0).size(k) for k in range(10)]  # resumable
    x = torch.randn(2, 3, 64, 64)
    assert dyn(x, 3).shape[-1] == dyn.size(3)
    prog = Resolution(make_cfg("data.resolution=progressive", "data.resolution_step=32").data, 64, 1000, 0)
    sizes = [prog.size(k) for k in range(1000)]
    assert set(sizes[:500]) == {32} and set(sizes[800:]) == {64}  # held at 0.5, full size from 80 %
    ramp = [s == 64 for s in sizes[500:800]]
    assert 0.3 < sum(ramp) / len(ramp) < 0.7 and sum(ramp[:100]) < sum(ramp[100:200]) < sum(ramp[200:])  # smooth mix
    step = Resolution(make_cfg("data.resolution=progressive", "data.progressive_until=0.5").data, 64, 1000, 0)
    assert [step.size(k) for k in (0, 499, 500, 999)] == [32, 32, 64, 64]  # from == until: one switch


def test_resolution_rounds_stochastically_to_the_step():
    """A 48 px target on a 32 px grid is half 32 px, half 64 px batches: the expected size is kept."""
    from turbotrain.data.resolution import Resolution

    cfg = make_cfg("data.resolution=dynamic", "data.resolution_step=32", "data.resolution_scale=[0.75,0.75]").data
    sizes = [Resolution(cfg, 64, 2000, 0).size(k) for k in range(2000)]
    assert set(sizes) == {32, 64} and abs(sum(sizes) / len(sizes) - 48) < 2


def test_warns_when_the_smallest_size_collapses_feature_maps(caplog):
    """resnet18 downsamples 32x: 32 px batches give its layer4 1x1 maps, 64 px give 2x2."""
    from torchvision.models import resnet18

    from turbotrain.data.resolution import Resolution, smallest_feature_map, warn_if_maps_collapse

    model = resnet18(num_classes=10)
    assert [smallest_feature_map(model, 3, s) for s in (32, 64, 96)] == [1, 2, 3]
    assert model.training  # restored after the eval-mode probe
    for nominal, start, warned in ((64, 0.5, True), (96, 2 / 3, False)):
        caplog.clear()
        cfg = make_cfg("data.resolution=progressive", "data.resolution_step=32", f"data.progressive_start={start}").data
        warn_if_maps_collapse(model, 3, Resolution(cfg, nominal, 100, 0), "resnet18")
        assert ("1x1" in caplog.text) is warned, (nominal, caplog.text)


def test_dynamic_resolution_run_evaluates_at_nominal_size(tmp_path, monkeypatch):
    from conftest import TINY
    from turbotrain.train import session as pipeline
    from turbotrain.train.run import train

    sizes = {True: set(), False: set()}  # model.training -> input sizes seen

    def record(module, args):
        sizes[module.training].add(tuple(args[0].shape[-2:]))

    real_evaluate = pipeline.evaluate

    def evaluate_and_watch(model, *args, **kwargs):  # the real evaluate, with the model's inputs recorded
        if not model._forward_pre_hooks:
            model.register_forward_pre_hook(record)
        return real_evaluate(model, *args, **kwargs)

    monkeypatch.setattr(pipeline, "evaluate", evaluate_and_watch)
    cfg = make_cfg(*TINY, "data.image_size=16", "data.resolution=dynamic", "data.resolution_step=4", "trainer.max_epochs=2")
    assert train(cfg, tmp_path) > 0.3
    assert sizes[False] == {(16, 16)}, sizes  # every validation batch at the nominal size
    assert len(sizes[True]) > 1, sizes  # while training (epoch 2) used several sizes


def test_tf32_is_set_both_ways_so_a_sweeps_fp32_job_does_not_inherit_it():
    build_precision(make_cfg("precision=amp").precision, CPU)  # amp allows TF32 (precision.tf32=true)
    assert torch.backends.cuda.matmul.fp32_precision == torch.backends.cudnn.conv.fp32_precision == "tf32"
    build_precision(make_cfg("precision=fp32").precision, CPU)
    assert torch.backends.cuda.matmul.fp32_precision == torch.backends.cudnn.conv.fp32_precision == "ieee"


def test_a_bad_cpu_bf16_override_is_one_line_naming_the_variable(monkeypatch):
    monkeypatch.setenv(CPU_BF16_ENV, "yes")
    with pytest.raises(ConfigError, match=r"TURBOTRAIN_CPU_BF16='yes' must be 1 \(bf16\), 0 \(fp32\) or unset"):
        build_precision(make_cfg("precision=amp").precision, CPU)


@pytest.mark.parametrize("kernel", ["auto", "fused", "foreach"])
def test_sgd_kernel_is_the_one_asked_for_or_the_faster_one_timed(kernel, caplog):
    from turbotrain.train.optim import _fused_faster

    _fused_faster.cache_clear()
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Flatten(), nn.Linear(8 * 30 * 30, 10))
    with caplog.at_level("INFO", logger="turbotrain"):
        opt = build_optimizer(model, make_cfg("optim=sgd", f"optim.kernel={kernel}").optim)
    fused = {g["fused"] for g in opt.param_groups}
    timed = [r.getMessage() for r in caplog.records if "optim.kernel=auto" in r.getMessage()]
    if kernel == "auto":  # either may win on a CPU: the one logged as faster
        fused_ms, foreach_ms = (float(x) for x in re.findall(r"([\d.]+) ms", timed[0]))
        assert len(timed) == 1 and fused == {fused_ms <= foreach_ms}
    else:
        assert not timed and fused == {kernel == "fused"}
        assert all(g["foreach"] == (kernel == "foreach") for g in opt.param_groups)


@pytest.mark.parametrize(
    "fused_s, foreach_s, logged, takes_fused",
    [  # seconds per round of 3 steps, the first round a warm-up; median of the rest, per step
        ([9.0, 0.003, 0.018, 0.006], [9.0, 0.012, 0.030, 0.009], "fused kernel 2.00 ms, foreach 4.00 ms", True),
        ([0.0, 0.012, 0.030, 0.009], [0.0, 0.003, 0.018, 0.006], "fused kernel 4.00 ms, foreach 2.00 ms", False),
        ([0.0, 0.006, 0.006, 0.006], [9.0, 0.006, 0.006, 0.006], "fused kernel 2.00 ms, foreach 2.00 ms", True),  # a tie: fused
    ],
)
def test_sgd_kernel_timing_drops_its_warm_up_and_takes_the_median_per_step(
    fused_s, foreach_s, logged, takes_fused, monkeypatch, caplog
):
    """The clock scripted round by round (fused then foreach, as the timing interleaves them)."""
    from turbotrain.train import optim

    ends = iter(d for pair in zip(fused_s, foreach_s) for d in pair)
    now = [0.0, True]  # the time; whether the next read starts a round

    def perf_counter() -> float:
        if not now[1]:
            now[0] += next(ends)
        now[1] = not now[1]
        return now[0]

    monkeypatch.setattr(optim, "time", types.SimpleNamespace(perf_counter=perf_counter))
    optim._fused_faster.cache_clear()
    with caplog.at_level("INFO", logger="turbotrain"):
        assert optim._fused_faster(((3, 5),), 0.9, True) is takes_fused
    assert next(ends, None) is None  # every round was timed
    assert [r.getMessage() for r in caplog.records] == [f"optim.kernel=auto: SGD's {logged} per step here"]
    optim._fused_faster.cache_clear()  # the scripted verdict stays out of other tests


def test_a_short_run_takes_its_own_batches_and_keys_whatever_the_runs_trainer_says(tmp_path, monkeypatch):
    """A pruning fine-tune or autotune trial outside the run: the run's trainer.max_steps must not
    cut it short, its own trainer keys (channels_last=False) win over the run's, and it logs
    nothing (no metrics file in the directory it runs from)."""
    from turbotrain.train.loop import short_run

    monkeypatch.chdir(tmp_path)
    cfg = make_cfg("precision=fp32", "trainer.max_steps=1", "trainer.channels_last=true")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    layouts = []
    model[0].register_forward_pre_hook(lambda _, args: layouts.append(args[0].is_contiguous(memory_format=torch.channels_last)))
    loader = DataLoader(TensorDataset(torch.randn(40, 3, 8, 8), torch.randint(0, 3, (40,))), batch_size=8)
    steps = []
    precision = build_precision(cfg.precision, CPU)
    short_run(
        model,
        loader,
        cfg,
        device=CPU,
        precision=precision,
        batches=4,
        on_step=lambda s: steps.append(s.global_step),
        channels_last=False,
    )
    assert steps == [1, 2, 3, 4]
    assert layouts == [False] * 4
    layouts.clear()
    short_run(model, loader, cfg, device=CPU, precision=precision, batches=2, on_step=lambda s: None)  # the run's own key
    assert layouts == [True] * 2
    assert list(tmp_path.iterdir()) == []
