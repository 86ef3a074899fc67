"""Collectives under a default group that, like NCCL's, has no CPU backend: real DDP worker
processes whose default group is bound to CUDA tensors only (`cuda:gloo`), beside the run's
gloo side group. Every collective of a CPU tensor must go over the side group; one that takes the
default group fails as it would on GPUs: `No backend type associated with device type cpu`."""

from __future__ import annotations

import json
import os

from conftest import run_cli

# The default group binds gloo to the cuda device type only, as NCCL binds itself; the groups
# the run creates itself (backend="gloo") keep serving CPU tensors.
SITE = """
import torch.distributed as dist

real = dist.init_process_group


def init_process_group(backend=None, *args, **kwargs):
    with open(__import__("os").environ["GROUP_TRACE"] + "/%d" % __import__("os").getpid(), "w") as f:
        f.write(str(backend))
    return real("cuda:gloo" if backend == "gloo" else backend, *args, **kwargs)


dist.init_process_group = init_process_group
"""


def test_ddp_with_a_cuda_only_default_group_tunes_trains_and_validates(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SITE)
    (tmp_path / "trace").mkdir()
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "GROUP_TRACE": str(tmp_path / "trace")}
    run = tmp_path / "run"
    r = run_cli(
        "train.py",
        "data=digits",
        "model=small_cnn",
        "model.width=8",
        "loader=tuned",
        "loader.auto_candidates=[0]",
        "trainer.autotune=true",
        "trainer.autotune_knobs=[channels_last,num_workers]",
        "trainer.autotune_steps=3",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=12",
        "trainer.ema_decay=0.9",
        "trainer.progress_bar=false",
        "distributed=ddp",
        "distributed.nproc=2",
        f"hydra.run.dir={run}",
        env=env,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    # the spy saw both ranks' default groups: the run really met a CUDA-only default group
    assert sorted(p.read_text() for p in (tmp_path / "trace").iterdir()) == ["gloo", "gloo"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["autotune"]["chosen"]["num_workers"] == 0
    assert 0 < summary["best_val_acc1"] <= 1
