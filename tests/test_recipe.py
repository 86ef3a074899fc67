"""The recipe techniques that decide how many steps a model needs, each against a reference that
could fail: label smoothing, weight averaging (EMA), mixup and cutmix, flip TTA, and the weight
decay of norm and bias parameters; and a run with all of them resumed mid-epoch."""

from __future__ import annotations

import math

import pytest
import torch
import yaml
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchvision.transforms import v2

from conftest import TINY, make_cfg
from test_train import Interrupted, assert_same_run, interrupt_after_save
from turbotrain.config import ConfigError
from turbotrain.core import checkpoint as ckpt_io
from turbotrain.data.mixing import build_mix
from turbotrain.train.ema import build_ema, update_ema
from turbotrain.train.evaluation import evaluate
from turbotrain.train.loop import Step, TrainState
from turbotrain.train.optim import build_optimizer
from turbotrain.train.precision import FP32_CPU
from turbotrain.train.run import train

CPU = torch.device("cpu")


def test_label_smoothing_is_the_closed_form_on_a_hand_computed_batch():
    model = nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]))
    x, y = torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 2])  # logits (2, 0, 0) and (0, 1, 0)
    cfg = make_cfg("trainer.label_smoothing=0.3", "precision=fp32").trainer
    step = Step(model, torch.optim.SGD(model.parameters(), lr=0.1), None, FP32_CPU, cfg, None, torch.zeros(()))
    loss, _ = step.backward(x, y, 1, True, TrainState())
    # smoothed target: 0.7 on the label + 0.1 on each of the 3 classes; loss = -sum(target * log p)
    log_z1, log_z2 = math.log(math.exp(2) + 2), math.log(2 + math.e)
    first = 0.8 * (log_z1 - 2) + 0.1 * log_z1 + 0.1 * log_z1
    second = 0.1 * log_z2 + 0.1 * (log_z2 - 1) + 0.8 * log_z2
    assert loss.item() == pytest.approx((first + second) / 2, rel=1e-6)


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, bias=True), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 4 * 4, 2))


WEIGHTS, BIASES = ["0.weight", "3.weight"], ["0.bias", "1.bias", "3.bias"]  # conv, linear; conv, norm, linear


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ((), {0.05: WEIGHTS, 0.0: [*BIASES, "1.weight"]}),
        (
            ("optim.norm_weight_decay=null", "optim.bias_weight_decay=null"),
            {0.05: ["0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "3.bias"]},
        ),
        (
            ("optim.norm_weight_decay=0.1", "optim.bias_weight_decay=0.2"),
            {0.05: ["0.weight", "3.weight"], 0.2: ["0.bias", "1.bias", "3.bias"], 0.1: ["1.weight"]},
        ),
        (("optim.norm_weight_decay=null",), {0.05: [*WEIGHTS, "1.weight"], 0.0: BIASES}),
    ],
)
def test_parameter_groups_hold_what_the_keys_say(overrides, expected):
    model = _net()
    opt = build_optimizer(model, make_cfg("optim=adamw", *overrides).optim)
    names = {id(p): n for n, p in model.named_parameters()}
    got = {g["weight_decay"]: sorted(names[id(p)] for p in g["params"]) for g in opt.param_groups}
    assert got == {wd: sorted(ns) for wd, ns in expected.items()}


def test_ema_is_the_average_computed_by_hand():
    model = nn.Sequential(nn.Linear(1, 1, bias=False), nn.BatchNorm1d(1))
    cfg = make_cfg("trainer.ema_decay=0.5", "trainer.ema_warmup_steps=2", "trainer.ema_every_n_steps=2").trainer
    ema = build_ema(model, cfg)
    weights, expected = [3.0, 5.0, 7.0, 11.0, 13.0, 17.0], None
    for step, w in enumerate(weights, 1):
        with torch.no_grad():
            model[0].weight.fill_(w)
            model[1].running_mean.fill_(10 * w)
        update_ema(ema, model, step, cfg)
        if step % 2 == 0:  # every 2nd step; up to step 2 (warm-up) the average copies the weights
            expected = w if step <= 2 else 0.5 * expected + 0.5 * w
    assert expected == 0.5 * (0.5 * 5.0 + 0.5 * 11.0) + 0.5 * 17.0
    assert ema.module[0].weight.item() == expected
    assert ema.module[1].running_mean.item() == 10 * expected  # BatchNorm statistics averaged alike


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.rand(6, 3, 8, 8, generator=g), torch.tensor([0, 1, 2, 3, 4, 0])


def test_mixup_pixels_and_targets_follow_the_formula():
    x, y = _batch()
    torch.manual_seed(0)
    mixed, target = build_mix(make_cfg("data.mixup_alpha=0.4").data, "image", 5)(x, y)
    lam = target[1, 1].item()  # image 1 (class 1) is mixed with image 0 (class 0)
    assert 0 < lam < 1
    torch.testing.assert_close(mixed, lam * x + (1 - lam) * x.roll(1, 0))
    one_hot = nn.functional.one_hot(y, 5).float()
    torch.testing.assert_close(target, lam * one_hot + (1 - lam) * one_hot.roll(1, 0))
    torch.testing.assert_close(target.sum(1), torch.ones(6))


def test_cutmix_pastes_one_box_and_weighs_targets_by_its_area():
    x, y = _batch()
    torch.manual_seed(3)
    mixed, target = build_mix(make_cfg("data.cutmix_alpha=1.0").data, "image", 5)(x, y)
    rolled = x.roll(1, 0)
    pasted = (mixed == rolled).all(1) & (mixed != x).any(1)  # [batch, h, w]: pixels taken from the other image
    assert ((mixed == x) | (mixed == rolled)).all()
    box = pasted[1]
    rows, cols = box.any(1).nonzero().flatten(), box.any(0).nonzero().flatten()
    assert box.sum() == len(rows) * len(cols) > 0  # one rectangle, the same for every image
    lam = 1 - box.float().mean().item()
    one_hot = nn.functional.one_hot(y, 5).float()
    torch.testing.assert_close(target, lam * one_hot + (1 - lam) * one_hot.roll(1, 0))
    torch.testing.assert_close(target.sum(1), torch.ones(6))


@pytest.mark.parametrize("alpha", [0.2, 4.0])
def test_mixup_draws_its_weight_from_beta_alpha_alpha(alpha):
    """The configured alpha, not torchvision's default: 400 draws against Beta(alpha, alpha)
    (at 0.2 most weights sit near 0 or 1, at 4.0 near 0.5; alpha=1 would be uniform)."""
    from scipy import stats

    x, y = _batch()
    mix = build_mix(make_cfg(f"data.mixup_alpha={alpha}").data, "image", 5)
    torch.manual_seed(0)
    lams = [mix(x, y)[1][1, 1].item() for _ in range(400)]  # image 1 (class 1) mixed with image 0 (class 0)
    assert stats.kstest(lams, stats.beta(alpha, alpha).cdf).pvalue > 1e-3
    assert stats.kstest(lams, stats.uniform().cdf).pvalue < 1e-3  # what alpha=1 gives: the test can tell


@pytest.mark.parametrize("alpha", [0.3, 3.0])
def test_cutmix_box_area_follows_beta_alpha_alpha(alpha):
    """CutMix draws lambda ~ Beta(alpha, alpha) and cuts a box of area (1 - lambda) centred anywhere,
    clipped at the border: the pasted area matches torchvision's reference sampler given alpha."""
    from scipy import stats

    x, y = torch.rand(2, 3, 64, 64), torch.tensor([0, 1])
    mix = build_mix(make_cfg(f"data.cutmix_alpha={alpha}").data, "image", 2)
    reference = v2.CutMix(alpha=alpha, num_classes=2)
    torch.manual_seed(0)
    ours = [mix(x, y)[1][1, 0].item() for _ in range(1000)]  # the area pasted from image 0
    theirs = [reference(x, y)[1][1, 0].item() for _ in range(1000)]
    other = v2.CutMix(alpha=1.0, num_classes=2)
    default = [other(x, y)[1][1, 0].item() for _ in range(1000)]
    assert stats.ks_2samp(ours, theirs).pvalue > 1e-3
    assert stats.ks_2samp(ours, default).pvalue < 1e-3  # alpha=1.0 is told apart


def test_mixing_text_data_is_one_line_naming_the_key():
    with pytest.raises(ConfigError, match=r"data\.cutmix_alpha mixes images; data=wordnet is text: set it to 0"):
        build_mix(make_cfg("data=wordnet", "model=bert_tiny", "data.cutmix_alpha=1.0").data, "text", 6)


def test_flip_shift_tta_is_the_mean_of_six_views_softmax():
    """The image and its mirror, each as it is and moved one pixel up-left and down-right (border
    reflected), scored by the mean softmax: written out by hand with F.pad and slicing."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)).eval()
    x, y = torch.randn(10, 3, 8, 8), torch.randint(0, 3, (10,))
    got = evaluate(model, DataLoader(TensorDataset(x, y), batch_size=4), device=CPU, precision=FP32_CPU, tta="flip_shift")
    padded = [nn.functional.pad(v, (1, 1, 1, 1), mode="reflect") for v in (x, x.flip(-1))]
    views = [x, x.flip(-1), *(p[..., 2:10, 2:10] for p in padded), *(p[..., 0:8, 0:8] for p in padded)]
    assert torch.equal(padded[0][..., 2:10, 2:10][..., :-1, :-1], x[..., 1:, 1:])  # moved up-left by one pixel
    with torch.no_grad():
        p = torch.stack([model(v).softmax(1) for v in views]).mean(0)
    assert got["loss"] == pytest.approx(-p[torch.arange(10), y].log().mean().item(), rel=1e-5)
    assert got["acc1"] == pytest.approx((p.argmax(1) == y).float().mean().item())


@pytest.mark.parametrize("sched", ["cosine", "onecycle", "cyclic", "step", "exponential"])
def test_norm_layers_learn_at_their_multiple_of_the_rate_under_every_schedule(sched):
    """optim.norm_lr_scale=64: BatchNorm's weights and biases at 64x the rate of the rest, step
    after step, whatever the schedule does to the rate."""
    from turbotrain.train.sched import build_scheduler

    cfg = make_cfg("model=fast_cnn", f"sched={sched}", "optim.norm_lr_scale=64", "optim.lr=0.01")
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 2))
    opt = build_optimizer(model, cfg.optim)
    norm = {id(p) for p in model[1].parameters()}
    scheduler = build_scheduler(opt, cfg.sched, cfg.optim, total_steps=40, steps_per_epoch=10)
    for _ in range(25):
        rates = {("norm" if id(p) in norm else "rest"): g["lr"] for g in opt.param_groups for p in g["params"]}
        assert rates["norm"] == pytest.approx(64 * rates["rest"], rel=1e-9)
        opt.step()
        scheduler.step()
    assert rates["rest"] != pytest.approx(0.01)  # the schedule did move the rate


def test_flip_tta_is_the_mean_of_the_two_views_softmax():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)).eval()
    x, y = torch.randn(10, 3, 8, 8), torch.randint(0, 3, (10,))
    loader = DataLoader(TensorDataset(x, y), batch_size=4)
    got = evaluate(model, loader, device=CPU, precision=FP32_CPU, tta="flip")
    with torch.no_grad():
        p = (model(x).softmax(1) + model(x.flip(-1)).softmax(1)) / 2
    assert got["acc1"] == pytest.approx((p.argmax(1) == y).float().mean().item())
    assert got["loss"] == pytest.approx(-p[torch.arange(10), y].log().mean().item(), rel=1e-5)
    assert got["acc1_no_tta"] == pytest.approx((model(x).argmax(1) == y).float().mean().item())
    assert got["acc1"] != got["acc1_no_tta"] or got["loss"] != evaluate(model, loader, device=CPU, precision=FP32_CPU)["loss"]


ALL = (
    *TINY,
    "trainer.max_epochs=2",
    "trainer.checkpoint_every_n_steps=5",
    "trainer.label_smoothing=0.1",
    "trainer.ema_decay=0.9",
    "trainer.ema_warmup_steps=3",
    "trainer.ema_every_n_steps=2",
    "trainer.tta=flip",
    "data.mixup_alpha=0.2",
    "data.cutmix_alpha=1.0",
    "optim.norm_weight_decay=0.01",
    "optim.bias_weight_decay=null",
)


def test_a_run_with_every_technique_killed_mid_epoch_resumes_bit_for_bit(tmp_path, monkeypatch):
    train(make_cfg(*ALL), tmp_path / "full")
    with monkeypatch.context() as m:
        interrupt_after_save(m, lambda c: c["state"]["global_step"] == 30)
        with pytest.raises(Interrupted):
            train(make_cfg(*ALL), tmp_path / "split")
    assert ckpt_io.load(tmp_path / "split" / "checkpoints" / "last.pt")["state"]["batch_in_epoch"] == 8  # mid-epoch
    train(make_cfg(*ALL, "trainer.resume=auto"), tmp_path / "split")
    assert_same_run(tmp_path / "full", tmp_path / "split")
    a, b = (ckpt_io.load(d / "checkpoints" / "last.pt") for d in (tmp_path / "full", tmp_path / "split"))
    assert a["ema"]["updates"] == b["ema"]["updates"] > 0
    for k, v in a["ema"]["weights"].items():
        assert torch.equal(v, b["ema"]["weights"][k]), k
    assert not all(torch.equal(v, a["model"][k]) for k, v in a["ema"]["weights"].items())  # an average, not a copy
    assert {"val_acc1", "val_acc1_no_ema", "val_acc1_no_tta"} <= set(a["metrics"])


def test_a_key_added_after_a_run_or_a_state_field_removed_does_not_block_its_resume(tmp_path):
    train(make_cfg(*TINY, "trainer.max_epochs=1"), tmp_path)
    last = tmp_path / "checkpoints" / "last.pt"
    ckpt = ckpt_io.load(last)
    old = yaml.safe_load(ckpt["config"])
    del old["trainer"]["label_smoothing"], old["optim"]["norm_weight_decay"]  # as a run from before these keys
    ckpt["config"] = yaml.safe_dump(old)
    ckpt["state"]["retired_counter"] = 7  # a state field a later turbotrain dropped
    ckpt_io.atomic_save(ckpt, last)
    with pytest.raises(ConfigError, match=r"trainer\.label_smoothing: 0\.0 -> 0\.1"):
        train(make_cfg(*TINY, "trainer.max_epochs=2", "trainer.resume=auto", "trainer.label_smoothing=0.1"), tmp_path)
    train(make_cfg(*TINY, "trainer.max_epochs=2", "trainer.resume=auto"), tmp_path)
    assert ckpt_io.load(last)["state"]["epoch"] == 2


def test_a_run_draws_its_curves_and_tensorboard_reads_back_its_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from turbotrain.train.curves import read_events

    train(make_cfg(*TINY, "trainer.max_epochs=2", "trainer.tta=flip", "logger=tensorboard"), tmp_path)
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    board = EventAccumulator(str(tmp_path / "tensorboard"))
    board.Reload()
    events = read_events(tmp_path)
    for tag, split, key in (
        ("val/acc1", "val", "acc1"),
        ("val/acc1_no_tta", "val", "acc1_no_tta"),
        ("train/loss", "train", "loss"),
    ):
        logged = [(e["step"], e[key]) for e in events if e["split"] == split]
        read = [(s.step, s.value) for s in board.Scalars(tag)]
        assert [s for s, _ in read] == [s for s, _ in logged] and len(read) >= 2
        assert [v for _, v in read] == pytest.approx([v for _, v in logged], rel=1e-6)  # stored as float32
