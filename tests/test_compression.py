"""Channel pruning (torch-pruning) and weight pruning: shapes, FLOPs, round trips, errors."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf
from torch.utils.data import DataLoader

from conftest import TINY, make_cfg
from turbotrain.compression import prune
from turbotrain.compression.conv_lowrank import factorize_conv
from turbotrain.config import ConfigError
from turbotrain.core.checkpoint import load
from turbotrain.core.modules import count_macs
from turbotrain.data import build_data
from turbotrain.models import build_model, from_checkpoint
from turbotrain.train.evaluation import evaluate
from turbotrain.train.precision import build_precision
from turbotrain.train.run import train


def _prune_cfg(**kw):
    base = {
        "name": "channel_prune",
        "flops_reduction": 0.4,
        "channel_ratio": None,
        "importance": "l1",
        "steps": 1,
        "round_to": 8,
    }
    return OmegaConf.create({**base, **kw})


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small", "efficientnet_b0"])
def test_channel_prune_cuts_flops_and_keeps_a_working_model(name):
    torch.manual_seed(0)
    model = build_model(make_cfg(f"model={name}").model, 10, 3)
    x = torch.randn(2, 3, 64, 64)
    report = prune.channel_prune(model, x[:1], _prune_cfg())
    assert report["macs_reduction"] >= 0.4 and report["params_after"] < report["params_before"]
    assert count_macs(model, x[:1]) == report["macs_after"]
    model.train()
    out = model(x)
    assert out.shape == (2, 10)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    # The pruned architecture is rebuilt from conv groups + the state dict alone.
    fresh = build_model(make_cfg(f"model={name}").model, 10, 3)
    prune.restore(fresh, prune.record(model), model.state_dict())
    fresh.load_state_dict(model.state_dict())
    model.eval(), fresh.eval()
    torch.testing.assert_close(fresh(x), model(x))


@pytest.mark.parametrize("importance", ["group_l1", "taylor"])
def test_other_importances_run(importance):
    model = build_model(make_cfg("model=resnet18").model, 10, 3)
    x = torch.randn(4, 3, 32, 32)

    def grad_batch(m):
        m.zero_grad()
        m(x).sum().backward()

    report = prune.channel_prune(model, x[:1], _prune_cfg(importance=importance), grad_batch=grad_batch)
    assert report["macs_reduction"] >= 0.4


def test_impossible_targets_are_clear_errors():
    model = build_model(make_cfg("model=resnet18").model, 10, 3)
    x = torch.randn(1, 3, 32, 32)
    for bad in (1.0, 0.0, 1.5):
        with pytest.raises(ConfigError, match="flops_reduction"):
            prune.channel_prune(model, x, _prune_cfg(flops_reduction=bad))
    with pytest.raises(ConfigError, match="sparsity"):
        prune.weight_prune(model, 1.0)


def test_weight_prune_sparsity_equals_target_and_folds_away():
    model = build_model(make_cfg("model=resnet18").model, 10, 3)
    report = prune.weight_prune(model, 0.6)
    assert report["sparsity"] == pytest.approx(0.6, abs=1e-3)
    state = prune.plain_state_dict(model)
    assert not any(k.endswith(("_orig", "_mask")) for k in state)
    prune.make_permanent(model)
    assert set(model.state_dict()) == set(state)
    assert prune.sparsity_report(model)["sparsity"] == pytest.approx(0.6, abs=1e-3)


def test_pruned_run_checkpoint_round_trip_and_resume(tmp_path):
    base = tmp_path / "base"
    train(make_cfg(*TINY, "model.width=16", "trainer.max_epochs=2"), base)
    pruned = tmp_path / "pruned"
    cfg = make_cfg(
        *TINY,
        "model.width=16",
        "trainer.max_epochs=2",
        "compression=channel_prune",
        f"compression.from_run={base}",
        "compression.steps=2",
        "compression.finetune_steps=3",
    )
    train(cfg, pruned)
    ckpt = load(pruned / "checkpoints" / "last.pt")
    summary = ckpt["metrics"]
    model = from_checkpoint(ckpt, "last.pt")
    assert sum(p.numel() for p in model.parameters()) < 0.8 * sum(
        p.numel() for p in from_checkpoint(load(base / "checkpoints" / "last.pt"), "x").parameters()
    )
    assert summary["val_acc1"] > 0.3  # fine-tuned, not broken (chance 0.1)
    # resume of a pruned run rebuilds the pruned shapes from the checkpoint
    train(OmegaConf.merge(cfg, {"trainer": {"max_epochs": 3, "resume": "auto"}}), pruned)
    assert load(pruned / "checkpoints" / "last.pt")["state"]["epoch"] == 3


def test_weight_prune_run_keeps_sparsity_through_fine_tuning(tmp_path):
    base = tmp_path / "base"
    train(make_cfg(*TINY, "trainer.max_epochs=1"), base)
    run = tmp_path / "sparse"
    train(
        make_cfg(
            *TINY,
            "trainer.max_epochs=2",
            "compression=weight_prune",
            "compression.sparsity=0.7",
            f"compression.from_run={base}",
        ),
        run,
    )
    model = from_checkpoint(load(run / "checkpoints" / "last.pt"), "x")
    assert prune.sparsity_report(model)["sparsity"] == pytest.approx(0.7, abs=1e-3)


@pytest.mark.parametrize("stride, padding, dilation", [(1, 1, 1), (2, 0, 1), (1, 2, 2)])
def test_conv_lowrank_at_full_rank_equals_the_conv(stride, padding, dilation):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(6, 10, 3, stride=stride, padding=padding, dilation=dilation).eval()
    x = torch.randn(2, 6, 17, 17)
    full = factorize_conv(conv, min(10, 6 * 9)).eval()
    torch.testing.assert_close(full(x), conv(x), rtol=1e-4, atol=1e-5)
    low = factorize_conv(conv, 3).eval()  # truncated: close to, not equal to, the conv
    assert 0 < (low(x) - conv(x)).abs().max() < conv(x).abs().max()


def test_conv_lowrank_cuts_macs_and_survives_checkpoint_and_resume(tmp_path, amp_path):
    base = tmp_path / "base"
    train(make_cfg(*TINY, "model.width=16", "trainer.max_epochs=1"), base)
    run = tmp_path / "lowrank"
    common = (*TINY, "model.width=16", "compression=conv_lowrank", "compression.rank_ratio=0.25", f"compression.from_run={base}")
    train(make_cfg(*common, "trainer.max_epochs=1"), run)
    ckpt = load(run / "checkpoints" / "last.pt")
    report = json.loads((run / "summary.json").read_text())["compression"]
    assert report["macs_after"] < 0.7 * report["macs_before"] and report["params_after"] < report["params_before"]
    assert ckpt["arch"]["conv_lowrank"] == report["ranks"]
    model = from_checkpoint(ckpt, "last.pt")  # the factorized shapes, rebuilt from the checkpoint alone
    assert count_macs(model, torch.zeros(1, 1, 8, 8)) == report["macs_after"]
    # evaluated as the run evaluated it: its precision (amp: bf16 or fp32), memory format and batches
    cfg, cpu = OmegaConf.create(ckpt["config"]), torch.device("cpu")
    data = build_data(cfg.data)
    val = DataLoader(data.val, batch_size=cfg.data.eval_batch_size or 2 * cfg.data.batch_size, collate_fn=data.collate)
    model.to(memory_format=torch.channels_last)
    acc = evaluate(model, val, device=cpu, precision=build_precision(cfg.precision, cpu), channels_last=True)["acc1"]
    assert acc == pytest.approx(ckpt["metrics"]["val_acc1"], abs=1e-6)  # rebuilt model == the run's eval
    train(make_cfg(*common, "trainer.max_epochs=2", "trainer.resume=auto"), run)
    assert load(run / "checkpoints" / "last.pt")["state"]["epoch"] == 2
