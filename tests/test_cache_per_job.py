"""The decoded cache is built once per job, not once per node: two torchrun agents, as two nodes
of one job, share one data.cache_dir (a cluster's shared home). Only global rank 0 builds; the
other node's rank finds the cache made and reads it. The build is counted by the warning it
prints for the one broken file (every rank logs warnings, so a second build prints it again)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from test_ddp_recovery import _free_port

from conftest import ROOT


def test_two_nodes_sharing_a_cache_dir_build_it_once_and_train(jpeg_tree, tmp_path):
    tree, cache, run = tmp_path / "tree", tmp_path / "cache", tmp_path / "run"
    shutil.copytree(jpeg_tree, tree)
    (tree / "train" / "china" / "broken.jpg").write_bytes(b"not a jpeg")
    args = ("data=imagenet", f"data.root={tree}", "data.cache=raw", f"data.cache_dir={cache}", "data.image_size=16")
    args += ("data.batch_size=8", "model=small_cnn", "model.width=4", "distributed=ddp", "trainer.max_epochs=1")
    args += ("trainer.progress_bar=false", "trainer.limit_train_batches=2", f"hydra.run.dir={run}")
    port = _free_port()
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    agent = (sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1", "--master-addr=127.0.0.1")
    nodes = [
        subprocess.Popen(
            [*agent, f"--master-port={port}", f"--node-rank={node}", str(ROOT / "train.py"), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=tmp_path,
        )
        for node in (0, 1)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    builds = sum(o.count("data.cache: skipped 1 file(s)") for o in outputs)
    assert builds == 1, "\n".join(o[-2000:] for o in outputs)  # 0: the warning moved; 2: one build per node
    assert len(list(cache.rglob("index.json"))) == 2  # one cache per split
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no temp folder left behind
    assert json.loads((run / "summary.json").read_text())["world_size"] == 2


def test_a_cache_another_process_finished_first_is_kept_and_ours_dropped(tmp_path):
    """Two jobs building the same cache: the second to finish must not replace the folder the
    first may already have memory-mapped; its own build is dropped, no temp folder is left."""
    from turbotrain.core.atomic import atomic_write_dir

    folder = tmp_path / "cache"

    def fill(tmp):
        (tmp / "images.bin").write_bytes(b"second")
        folder.mkdir()  # the other job's rename lands while this one still fills
        (folder / "images.bin").write_bytes(b"first")

    assert atomic_write_dir(folder, fill, replace=False) is False
    assert (folder / "images.bin").read_bytes() == b"first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]
    assert atomic_write_dir(folder, lambda tmp: (tmp / "images.bin").write_bytes(b"new")) is True
    assert (folder / "images.bin").read_bytes() == b"new"  # the default (other folders) swaps it in
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]  # the folder it replaced is gone
    alone = tmp_path / "alone"  # nobody else built this one: ours is put in place, and said so
    assert atomic_write_dir(alone, lambda tmp: (tmp / "images.bin").write_bytes(b"ours"), replace=False) is True
    assert (alone / "images.bin").read_bytes() == b"ours"


def test_two_writers_of_one_folder_fill_their_own_temp_folders(tmp_path):
    """Another process starting to write the same folder meanwhile (a rank of another node, another
    job) neither clears nor reuses ours; a leftover temp of a killed writer with this pid is cleared."""
    import socket

    from turbotrain.core.atomic import atomic_write_dir

    target = tmp_path / "cache"
    leftover = tmp_path / f".cache.tmp-{socket.gethostname()}-{os.getpid()}"  # pid reused after a kill -9
    (leftover / "stale").mkdir(parents=True)

    def ours(tmp):
        (tmp / "a.bin").write_bytes(b"ours")
        child = os.fork()
        if child == 0:  # only file calls here: the parent's threads do not exist in the child
            code = 1
            try:
                atomic_write_dir(target, lambda t: (t / "a.bin").write_bytes(b"theirs"), replace=False)
                code = 0
            finally:
                os._exit(code)
        assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0
        assert sorted(p.name for p in tmp.iterdir()) == ["a.bin"] and (tmp / "a.bin").read_bytes() == b"ours"

    assert atomic_write_dir(target, ours, replace=False) is False  # theirs finished first and stays
    assert (target / "a.bin").read_bytes() == b"theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]
