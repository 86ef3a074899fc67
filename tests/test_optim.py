"""Each optim option is torch's optimizer with every key of its config passed through: three
steps of it equal three steps of the torch optimizer built by hand with those values (a key
dropped or swapped for its default moves the weights)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import make_cfg
from turbotrain.train.optim import build_optimizer

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
