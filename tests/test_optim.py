"""Each optim option is torch's optimizer with every key of its config passed through: three
steps of it equal three steps of the torch optimizer built by hand with those values (a key
dropped or swapped for its default moves the weights). Then the groups they get, and the SGD
kernel optim.kernel=auto answers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import make_cfg
from turbotrain.train import numerics, optim
from turbotrain.train.optim import auto_kernel, build_optimizer, param_groups

WD = "optim.weight_decay=0.01"
CASES = {
    "sgd": (
        ("optim.lr=0.3", "optim.momentum=0.8", "optim.nesterov=false", "optim.kernel=foreach", WD),
        lambda p: torch.optim.SGD(p, lr=0.3, momentum=0.8, nesterov=False, weight_decay=0.01, foreach=True),
    ),
    "sgd_nesterov_fused": (
        ("optim.lr=0.3", "optim.momentum=0.8", "optim.kernel=fused", WD),
        lambda p: torch.optim.SGD(p, lr=0.3, momentum=0.8, nesterov=True, weight_decay=0.01, fused=True),
    ),
    "sgd_no_momentum": (  # nesterov needs momentum: it is dropped, not refused
        ("optim.lr=0.3", "optim.momentum=0", "optim.nesterov=true", "optim.kernel=foreach", WD),
        lambda p: torch.optim.SGD(p, lr=0.3, weight_decay=0.01, foreach=True),
    ),
    "adam": (
        ("optim.lr=0.02", "optim.betas=[0.8,0.9]", "optim.eps=1e-3", WD),
        lambda p: torch.optim.Adam(p, lr=0.02, betas=(0.8, 0.9), eps=1e-3, weight_decay=0.01, fused=True),
    ),
    "adamw": (
        ("optim.lr=0.02", "optim.betas=[0.8,0.9]", "optim.eps=1e-3", WD),
        lambda p: torch.optim.AdamW(p, lr=0.02, betas=(0.8, 0.9), eps=1e-3, weight_decay=0.01, fused=True),
    ),
    "rmsprop": (
        ("optim.lr=0.02", "optim.alpha=0.7", "optim.momentum=0.5", "optim.eps=1e-3", WD),
        lambda p: torch.optim.RMSprop(p, lr=0.02, alpha=0.7, momentum=0.5, eps=1e-3, weight_decay=0.01),
    ),
    "adagrad": (
        ("optim.lr=0.02", "optim.eps=1e-3", WD),
        lambda p: torch.optim.Adagrad(p, lr=0.02, eps=1e-3, weight_decay=0.01, fused=True),
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_each_optimizer_steps_as_torchs_own_with_the_configs_values(case):
    overrides, reference = CASES[case]
    option = case.split("_")[0]
    torch.manual_seed(0)
    ours, theirs = nn.Linear(5, 3, bias=False), nn.Linear(5, 3, bias=False)  # no bias, no norm: one group
    theirs.load_state_dict(ours.state_dict())
    start = ours.weight.detach().clone()
    optimizers = build_optimizer(ours, make_cfg(f"optim={option}", *overrides).optim), reference(theirs.parameters())
    for _ in range(3):
        x = torch.randn(8, 5)
        for model, opt in zip((ours, theirs), optimizers, strict=True):
            opt.zero_grad()
            model(x).square().sum().backward()
            opt.step()
    assert (ours.weight - start).abs().min() > 1e-3  # every weight moved
    torch.testing.assert_close(ours.weight, theirs.weight, rtol=0, atol=0)


def test_a_tied_parameter_is_in_one_group_once_and_a_frozen_one_in_none():
    """torch refuses a parameter listed twice; a frozen one would still take weight decay's update."""
    model = nn.Sequential(nn.Embedding(10, 4), nn.LayerNorm(4), nn.Linear(4, 10))
    model[2].weight = model[0].weight  # tied, as a language model's input and output embeddings
    model[1].bias.requires_grad_(False)
    groups = param_groups(model, make_cfg("optim=adamw").optim)
    listed = [p for g in groups for p in g["params"]]
    assert [id(p) for p in listed] == [id(model[0].weight), id(model[1].weight), id(model[2].bias)]
    build_optimizer(model, make_cfg("optim=adamw").optim)  # torch's own duplicate check passes


@pytest.mark.parametrize("fused_faster", [True, False])
def test_auto_kernel_on_a_cpu_takes_the_timings_answer_and_the_run_records_it(fused_faster, monkeypatch):
    """Scripted timings: which kernel wins is the CPU's business, what is done with the answer ours."""
    monkeypatch.setattr(optim, "_fused_faster", lambda *shape_and_momentum: fused_faster)
    kernel = "fused" if fused_faster else "foreach"
    assert auto_kernel([torch.zeros(3)], make_cfg("optim=sgd").optim) == kernel  # one parameter is enough
    model = nn.Linear(3, 2)
    opt = build_optimizer(model, make_cfg("optim=sgd", "optim.kernel=auto").optim)
    assert {(g["fused"], g["foreach"]) for g in opt.param_groups} == {(fused_faster, not fused_faster)}
    cfg = make_cfg("optim=sgd", "optim.kernel=auto")
    numerics.resolve(cfg, model, torch.device("cpu"), agree=lambda v: v, ckpt=None)
    assert cfg.optim.kernel == kernel


def test_auto_kernel_times_nothing_without_cpu_parameters(monkeypatch):
    """No parameters (a model all frozen), or parameters off the CPU with no device named: fused."""
    monkeypatch.setattr(optim, "_fused_faster", lambda *args: pytest.fail("timed"))
    c = make_cfg("optim=sgd").optim
    assert auto_kernel([], c) == "fused"
    assert auto_kernel([torch.zeros(3, device="meta")], c) == "fused"  # meta stands in for a GPU
