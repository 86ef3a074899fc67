"""DDP with a BatchNorm model: each rank's training forward updates its own running statistics
(DDP broadcasts rank 0's only at the start of the next forward). Validation, the weight average
and the saved model must all use one set: every rank's buffers are equal whenever it evaluates,
and the logged validation accuracy is the accuracy of best.pt scored by one process.

A spy (sitecustomize, first on PYTHONPATH) wraps the evaluate that session.py calls and saves,
per rank and call, the buffers of the model it was given. Bad samples are counted per rank;
summary.json must hold the run's total."""

from __future__ import annotations

import json
import os
import shutil
import textwrap

import torch
from omegaconf import OmegaConf

from conftest import run_cli

SPY = """
import os
import torch
import turbotrain.train.session as session

_real, _calls = session.evaluate, [0]

def _spy(model, loader, **kw):
    out = _real(model, loader, **kw)
    buffers = {k: b.detach().cpu().clone() for k, b in model.named_buffers()}
    torch.save(buffers, os.path.join(os.environ["SPY_DIR"], f"rank{os.environ['RANK']}_call{_calls[0]}.pt"))
    _calls[0] += 1
    return out

session.evaluate = _spy
"""


def test_ranks_validate_average_and_save_one_set_of_batchnorm_statistics(jpeg_tree, tmp_path):
    tree, run, spy = tmp_path / "tree", tmp_path / "run", tmp_path / "spy"
    shutil.copytree(jpeg_tree, tree)
    for cls in ("china", "flower"):
        for stem in ("003", "040"):  # 4 in all: both ranks meet some
            (tree / "train" / cls / f"{stem}.jpg").write_bytes(b"not a jpeg")
    spy.mkdir()
    (spy / "sitecustomize.py").write_text(textwrap.dedent(SPY))
    args = ("data=imagenet", f"data.root={tree}", "data.image_size=16", "data.batch_size=8", "precision=fp32")
    args += ("model=small_cnn", "model.width=4", "trainer.ema_decay=0.5", "trainer.max_epochs=2")
    args += ("distributed=ddp", "distributed.nproc=2", "loader.num_workers=0", "trainer.progress_bar=false")
    env = {**os.environ, "PYTHONPATH": str(spy), "SPY_DIR": str(spy), "OMP_NUM_THREADS": "1"}
    r = run_cli("train.py", *args, f"hydra.run.dir={run}", env=env)
    assert r.returncode == 0, r.stderr[-3000:]

    calls = sorted(p.name for p in spy.glob("rank0_call*.pt"))
    assert len(calls) == 4, calls  # 2 epochs x (the average, then the trained weights): the spy saw them
    for name in calls:
        ours, theirs = torch.load(spy / name), torch.load(spy / name.replace("rank0", "rank1"))
        assert ours and ours.keys() == theirs.keys()
        for key in ours:
            torch.testing.assert_close(theirs[key], ours[key], rtol=0, atol=0, msg=f"{name} {key}")

    summary = json.loads((run / "summary.json").read_text())
    assert summary["bad_samples"] == 2 * 2 * summary["epochs"]  # 4 broken files read once per epoch
    assert summary["best_val_acc1"] == _one_process_acc1(run / "checkpoints" / "best.pt")


def _one_process_acc1(path) -> float:
    from turbotrain.core.checkpoint import load
    from turbotrain.data import build_data
    from turbotrain.models.saved import from_checkpoint

    ckpt = load(path)
    model = from_checkpoint(ckpt, path)
    data = build_data(OmegaConf.create(ckpt["config"]).data)
    x, y = data.collate([data.val[i] for i in range(len(data.val))])[:2]
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()
