"""fast_cnn and its patch-whitening first layer: the filters whiten what they were fitted on,
stay frozen in a run, resume bit for bit and export like any CNN."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from conftest import make_cfg, run_cli
from test_train import Interrupted, assert_same_run, interrupt_after_save
from turbotrain.core import checkpoint as ckpt_io
from turbotrain.data import build_data
from turbotrain.models import build_for, build_model
from turbotrain.models.whitening import EPS, PatchWhitening, fit_whitening
from turbotrain.train.run import train

FAST = ("data=digits", "model=fast_cnn", "model.widths=[8,16]", "trainer.progress_bar=false", "trainer.max_epochs=2")


def _patches(x: torch.Tensor, k: int) -> torch.Tensor:
    return x.unfold(2, k, 1).unfold(3, k, 1).permute(0, 2, 3, 1, 4, 5).reshape(-1, x.shape[1] * k * k).double()


def test_patch_whitening_decorrelates_the_patches_it_was_fitted_on():
    torch.manual_seed(0)
    x = F.avg_pool2d(torch.randn(64, 2, 20, 20), 3, stride=1)  # neighbours strongly correlated
    layer = PatchWhitening(2, 2)
    layer.fit(x)
    out = layer(x).double()
    half = out[:, :8].permute(0, 2, 3, 1).reshape(-1, 8)  # the second half is the negatives
    eigenvalues = torch.linalg.eigvalsh(torch.cov(_patches(x, 2).T))
    cov = torch.cov(half.T)
    assert torch.allclose(cov.diagonal().sort().values, (eigenvalues / (eigenvalues + EPS)).sort().values, atol=1e-4)
    assert (cov - torch.diag(cov.diagonal())).abs().max() < 1e-4
    raw = torch.cov(_patches(x, 2).T)
    assert raw.triu(1).abs().max() > 0.5 * raw.diagonal().max()  # the input was far from white
    torch.testing.assert_close(out[:, 8:], -out[:, :8])


def test_a_fast_cnn_run_keeps_its_fitted_filters_and_resumes_bit_for_bit(tmp_path, monkeypatch):
    cfg = make_cfg(*FAST)
    train(cfg, tmp_path / "full")
    data = build_data(cfg.data)
    fitted_model = build_for(cfg.model, data, None, 0)  # built and fitted as a fresh run does it
    fit_whitening(fitted_model, data)
    fitted = fitted_model[0]
    trained = ckpt_io.load(tmp_path / "full" / "checkpoints" / "last.pt")["model"]
    assert torch.equal(trained["0.conv.weight"], fitted.conv.weight)
    assert not torch.equal(trained["2.weight"], fitted_model[2].weight)  # the next layer did train
    with monkeypatch.context() as m:
        interrupt_after_save(m, lambda c: c["state"]["global_step"] == 30)
        with pytest.raises(Interrupted):
            train(make_cfg(*FAST, "trainer.checkpoint_every_n_steps=10"), tmp_path / "split")
    train(make_cfg(*FAST, "trainer.checkpoint_every_n_steps=10", "trainer.resume=auto"), tmp_path / "split")
    assert_same_run(tmp_path / "full", tmp_path / "split")


def test_without_whitening_the_same_first_layer_is_learned():
    cfg = make_cfg("model=fast_cnn", "model.widths=[8]", "model.stem_patch=3", "model.whiten=false")
    model = build_model(cfg.model, 10, 1)
    assert not isinstance(model[0], PatchWhitening)
    assert model[0].weight.shape == (18, 1, 3, 3) and model[0].weight.requires_grad


@pytest.mark.slow  # a training run and an INT8 export in a fresh process: ~25 s
def test_a_fast_cnn_run_exports_to_int8(tmp_path):
    run = tmp_path / "outputs" / "train" / "fast"
    train(make_cfg(*FAST), run)
    r = run_cli("export.py", "deploy=int8", f"run={run}", "deploy.latency_repeats=3")
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((run / "export" / "int8" / "report.json").read_text())
    assert report["dtype"].startswith("int8 (static") and report["argmax_agreement"] >= 0.9
    assert report["fp32_val_acc1"] - report["val_acc1"] <= 0.03


def test_dirac_init_passes_each_blocks_input_through_its_first_channels():
    from turbotrain.models.fast_cnn import FastCNN

    torch.manual_seed(0)
    model = FastCNN(10, 1, [16, 32, 48], stem_patch=2, whiten=False, dirac=True)
    convs = [m for m in model if isinstance(m, torch.nn.Conv2d)][1:]  # the blocks' (the stem is the whitening layer's)
    assert [c.in_channels for c in convs] == [8, 16, 32]
    for conv in convs:
        x = torch.randn(2, conv.in_channels, 6, 6)
        out = conv(x)
        assert torch.equal(out[:, : conv.in_channels], x)  # identity on the first in_channels outputs
        assert out[:, conv.in_channels :].abs().sum() > 0  # the rest as torch draws them
    plain = FastCNN(10, 1, [16, 32, 48], stem_patch=2, whiten=False)
    assert not torch.equal(plain[2].weight[:8], model[2].weight[:8])
