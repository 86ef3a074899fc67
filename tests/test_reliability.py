"""Fault injection in real processes: kill -9 and resume, SIGTERM, bad files, bad configs, NaNs."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import ROOT, TINY, make_cfg, run_cli
from turbotrain.config import ConfigError
from turbotrain.core import checkpoint as ckpt_io
from turbotrain.core.atomic import remove_stale_temps
from turbotrain.core.checkpoint import load
from turbotrain.train.run import TrainingError, train

KILLABLE = (*TINY, "trainer.max_epochs=4", "trainer.checkpoint_every_n_steps=3")


def _start(args, run_dir, cwd):
    return subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), *args, f"hydra.run.dir={run_dir}"],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_step(run_dir, proc, step, timeout=120):
    last = run_dir / "checkpoints" / "last.pt"
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "no checkpoint in time"
        if last.is_file() and load(last)["state"]["global_step"] >= step:
            return
        time.sleep(0.05)


@pytest.mark.slow  # real processes, ~20-50 s on a 2-core CPU: `python -m pytest -m slow`
def test_kill_9_then_resume_equals_uninterrupted(tmp_path):
    full, killed = tmp_path / "full", tmp_path / "killed"
    r = run_cli("train.py", *KILLABLE, f"hydra.run.dir={full}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    proc = _start(KILLABLE, killed, tmp_path)
    _wait_for_step(killed, proc, 30)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    load(killed / "checkpoints" / "last.pt")  # intact, even when the kill landed mid-write
    r = run_cli("train.py", *KILLABLE, "trainer.resume=auto", f"hydra.run.dir={killed}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [p.name for p in (killed / "checkpoints").iterdir() if not p.name.endswith(".pt")] == []  # temps removed
    a, b = load(full / "checkpoints" / "last.pt"), load(killed / "checkpoints" / "last.pt")
    assert a["metrics"] == b["metrics"] and a["state"]["global_step"] == b["state"]["global_step"]
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k


def test_crash_during_checkpoint_write_keeps_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    ckpt_io.atomic_save({"format": 1, "model": {"w": torch.zeros(3)}}, path)

    def dying_save(obj, f):
        f.write(b"partial bytes")
        raise KeyboardInterrupt  # the process dies mid-write

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        ckpt_io.atomic_save({"format": 1, "model": {"w": torch.ones(3)}}, path)
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]
    assert torch.equal(load(path)["model"]["w"], torch.zeros(3))


def test_resume_removes_temp_files_of_a_killed_write(tmp_path):
    """kill -9 inside atomic_save leaves its temp file (no cleanup runs); the next run removes it."""
    train(make_cfg(*TINY, "trainer.max_epochs=1"), tmp_path)
    stale = tmp_path / "checkpoints" / ".last.pt.tmp424242"
    stale.write_bytes(b"partial bytes")
    train(make_cfg(*TINY, "trainer.max_epochs=2", "trainer.resume=auto"), tmp_path)
    assert not stale.exists() and load(tmp_path / "checkpoints" / "last.pt")["state"]["epoch"] == 2


def test_stale_temps_are_those_of_dead_writers_and_a_live_writer_is_not_signalled(tmp_path):
    """A temp whose writer has exited is removed; the temps of a live writer of ours and of a live
    process of another user (kill(pid, 0) refused) stay, and the live writer gets no signal."""
    dead = subprocess.Popen(["true"])
    dead.wait()  # reaped: its pid names no process
    # the live writer notes each signal it gets, rather than being ended by it: a signal inherited
    # as ignored (SIGHUP under nohup) would end nothing and go unseen
    live = subprocess.Popen([sys.executable, "-c", SIGNAL_RECORDER], stdout=subprocess.PIPE, text=True)
    names = {who: f".last.pt.tmp{pid}" for who, pid in (("dead", dead.pid), ("live", live.pid))}
    try:
        assert live.stdout.readline() == "listening\n"
        for name in names.values():
            (tmp_path / name).write_bytes(b"partial")
        assert remove_stale_temps(tmp_path) == [names["dead"]]
        assert sorted(p.name for p in tmp_path.iterdir()) == [names["live"]]
    finally:
        live.send_signal(signal.SIGTERM)  # the recorder's last signal: it prints what it got and exits
        received = live.communicate(timeout=30)[0]
    assert received.split() == [str(int(signal.SIGTERM))], f"the live writer was signalled: {received}"
    (tmp_path / names["live"]).unlink()
    _another_users_writer_keeps_its_temp(tmp_path)


SIGNAL_RECORDER = """
import signal, sys, time
got = []
def note(signum, frame):
    got.append(signum)
    if signum == signal.SIGTERM:
        print(*got, flush=True)
        sys.exit(0)
for s in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}:
    try:
        signal.signal(s, note)
    except (OSError, ValueError):
        pass
print("listening", flush=True)
time.sleep(60)
"""


def _another_users_writer_keeps_its_temp(tmp_path):
    """As root, a child that drops to uid 65534 judges this (root's) process; as another user,
    pid 1 is root's. Either way kill(pid, 0) raises PermissionError for a live process."""
    if os.getuid() != 0 and os.stat("/proc/1").st_uid == os.getuid():
        pytest.skip("no live process of another user to judge: pid 1 is this user's")
    owner = os.getpid() if os.getuid() == 0 else 1
    temp = tmp_path / f".last.pt.tmp{owner}"
    temp.write_bytes(b"partial")
    child = os.fork()
    if child == 0:  # only os calls here: the parent's threads do not exist in the child
        code = 1
        try:
            os.chdir(tmp_path)  # entered before dropping root: its parents are root's alone
            if os.getuid() == 0:
                os.chmod(".", 0o777)
                os.setuid(65534)
            code = 0 if remove_stale_temps(".") == [] and os.path.exists(temp.name) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "another user's live writer lost its temp"


def test_sigterm_writes_checkpoint_and_exits_nonzero(tmp_path):
    run = tmp_path / "run"
    args = (*TINY, "trainer.max_epochs=200")
    proc = _start(args, run, tmp_path)
    _wait_for_step(run, proc, 1)  # the first epoch's checkpoint exists: training is under way
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "stopped by SIGTERM" in stderr and "trainer.resume=auto" in stderr and "Traceback" not in stderr
    saved = load(run / "checkpoints" / "last.pt")["state"]
    # a whole epoch to train after the rest of the saved one (none, when the stop came in its validation)
    target = saved["epoch"] + 2
    r = run_cli("train.py", *TINY, f"trainer.max_epochs={target}", "trainer.resume=auto", f"hydra.run.dir={run}")
    assert r.returncode == 0, r.stderr[-2000:]
    resumed = load(run / "checkpoints" / "last.pt")["state"]
    assert resumed["global_step"] > saved["global_step"] and resumed["epoch"] == target


@pytest.fixture()
def bad_tree(jpeg_tree, tmp_path):
    tree = tmp_path / "bad_tree"
    shutil.copytree(jpeg_tree, tree)
    truncated = tree / "train" / "china" / "000.jpg"
    truncated.write_bytes(truncated.read_bytes()[:300])
    (tree / "train" / "flower" / "notes.jpg").write_text("not an image")
    (tree / "train" / "zzz_empty").mkdir()
    (tree / "val" / "zzz_empty").mkdir()
    return tree


def _tree_args(tree):
    return (
        "data=imagenet",
        f"data.root={tree}",
        "data.image_size=32",
        "data.batch_size=16",
        "model=small_cnn",
        "model.width=8",
        "trainer.max_epochs=1",
        "trainer.progress_bar=false",
    )


def test_bad_files_are_skipped_counted_and_named(bad_tree, tmp_path):
    run = tmp_path / "run"
    r = run_cli("train.py", *_tree_args(bad_tree), f"hydra.run.dir={run}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((run / "summary.json").read_text())["bad_samples"] == 2
    log = (run / "train.log").read_text()
    assert "000.jpg" in log and "notes.jpg" in log and "zzz_empty" in log


@pytest.mark.slow  # the skip policy's test covers the same bad tree
def test_bad_files_with_error_policy_name_the_file(bad_tree, tmp_path):
    r = run_cli("train.py", *_tree_args(bad_tree), "data.on_bad_sample=error", "hydra.run.dir=" + str(tmp_path / "r"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "empty" in r.stderr or ".jpg" in r.stderr
    shutil.rmtree(bad_tree / "train" / "zzz_empty")
    shutil.rmtree(bad_tree / "val" / "zzz_empty")
    r = run_cli("train.py", *_tree_args(bad_tree), "data.on_bad_sample=error", "hydra.run.dir=" + str(tmp_path / "r2"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "bad sample" in r.stderr and (".jpg" in r.stderr)


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("model=resnet19", "allowed: bert_tiny, efficientnet_b0, fast_cnn, hf, minilm"),
        ("data.batch_size=lots", "data.batch_size"),
        ("optim.lr=-0.1", "optim.lr"),
        ("data.batch_size=0", "data.batch_size"),
        ("compression=channel_prune compression.flops_reduction=1.0", "compression.flops_reduction"),
        ("data=imagenet", "data.root"),
        ("data=webdataset data.root=/no/such/dir", "data.root=/no/such/dir: no such directory"),
        ("precision.name=fp8", "allowed: fp32, amp, bf16, fp16"),
    ],
)
def test_bad_config_is_one_clear_line(override, needle, tmp_path):
    r = run_cli("train.py", *override.split(), f"hydra.run.dir={tmp_path}")
    assert r.returncode != 0 and needle in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) <= 8


def test_divergence_stops_with_step_loss_and_checkpoint(tmp_path):
    train(make_cfg(*TINY, "precision=fp32", "trainer.max_epochs=1"), tmp_path)  # a good epoch first
    last = tmp_path / "checkpoints" / "last.pt"
    step = load(last)["state"]["global_step"]
    cfg = make_cfg(
        *TINY,
        "precision=fp32",
        "trainer.max_epochs=2",
        "trainer.resume=auto",
        "trainer.resume_strict=false",
        "optim.lr=1e12",  # the next steps diverge
        "trainer.on_nan=stop",
    )
    with pytest.raises(TrainingError, match=rf"loss is (nan|inf) at step \d+.*last good checkpoint: {re.escape(str(last))}"):
        train(cfg, tmp_path)
    assert load(last)["state"]["global_step"] == step  # the diverged weights were never saved


def test_nan_skip_gives_up_after_patience(tmp_path):
    cfg = make_cfg(*TINY, "precision=fp32", "optim.lr=1e12", "trainer.nan_patience=3", "trainer.max_epochs=3")
    with pytest.raises(TrainingError) as stopped:
        train(cfg, tmp_path)
    assert re.fullmatch(
        r"training diverged: 3 consecutive steps skipped for non-finite losses or gradients at step \d+ "
        r"\(trainer\.on_nan=skip\); no checkpoint was written yet\. Try a lower optim\.lr, trainer\.grad_clip, or precision=fp32",
        str(stopped.value),
    ), str(stopped.value)
    assert not (tmp_path / "checkpoints" / "last.pt").exists()


@pytest.mark.parametrize("check", ["loss", "grads"])
def test_single_nan_batch_is_skipped(check, tmp_path):
    from test_loop import _data, _mlp, _run

    x, y = _data(32)
    x[8, 0] = float("nan")  # the second batch of 8 poisons its step only
    model = _mlp()
    state = _run(model, x, y, batch_size=8, accum=1, tmp_path=tmp_path, overrides=(f"trainer.nan_check={check}",))
    assert state.skipped_steps == 1 and state.global_step == 4
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_nan_in_one_micro_batch_skips_its_whole_group(tmp_path):
    from test_loop import _data, _mlp, _run

    x, y = _data(32)
    x[8, 0] = float("nan")  # micro-batch 2 of 4, in the first group of 2
    model = _mlp()
    state = _run(model, x, y, batch_size=8, accum=2, tmp_path=tmp_path)
    assert state.skipped_steps == 1 and state.global_step == 2
    assert all(torch.isfinite(p).all() for p in model.parameters())


OOM_AT_THIRD_LOSS = """
import runpy, sys, torch, torch.nn.functional as F
real, calls = F.cross_entropy, []
def cross_entropy(*args, **kwargs):  # the third loss of the run fails as a CUDA allocation would
    calls.append(1)
    if len(calls) == 3:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
    return real(*args, **kwargs)
F.cross_entropy = cross_entropy
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


def _one_line_error(fault: str, tmp_path) -> str:
    """The last stderr line of a TINY train.py run with `fault` injected (exit 2, no traceback)."""
    args = [*TINY, "trainer.max_epochs=1", f"hydra.run.dir={tmp_path}"]
    r = subprocess.run([sys.executable, "-c", fault, *args], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    return r.stderr.strip().splitlines()[-1]


def test_out_of_memory_in_a_step_is_one_line_naming_the_keys(tmp_path):
    last = _one_line_error(OOM_AT_THIRD_LOSS, tmp_path)
    assert last.startswith("error: out of memory: lower data.batch_size") and "Tried to allocate 20.00 GiB" in last
    for key in ("trainer.grad_accum_steps", "precision=amp", "attention.checkpointing"):
        assert key in last


METRICS_ON_A_FULL_DISK = """
import builtins, runpy, sys
import turbotrain.train.tracking as tracking
def open_(path, *args, **kwargs):  # the metrics log lands on /dev/full: its first write fails with ENOSPC
    return builtins.open("/dev/full" if str(path).endswith("metrics.jsonl") else path, *args, **kwargs)
tracking.open = open_
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


def test_a_full_disk_is_one_line_naming_the_file(tmp_path):
    last = _one_line_error(METRICS_ON_A_FULL_DISK, tmp_path)
    assert last.startswith("error: no space left on the device writing /dev/full:"), last
    assert "hydra.run.dir" in last and "data.cache_dir" in last


def test_cpu_allocation_failure_counts_as_out_of_memory():
    from turbotrain.core.errors import as_out_of_memory

    with pytest.raises(RuntimeError) as failed:  # a real allocation larger than any machine's memory
        torch.empty(2**45, dtype=torch.uint8)
    error = as_out_of_memory(failed.value)
    assert isinstance(error, MemoryError) and "lower data.batch_size" in str(error), failed.value
    assert as_out_of_memory(ValueError("x")).args == ("x",)


def _poison_first_grad_once(model) -> None:
    """The first backward after this call gives the first parameter NaN gradients while the loss
    stays finite (what an overflow inside backward does)."""
    fired = []

    def hook(grad):
        if fired:
            return grad
        fired.append(True)
        return torch.full_like(grad, float("nan"))

    next(model.parameters()).register_hook(hook)


@pytest.mark.parametrize(
    "overrides",
    [("trainer.nan_check=grads",), ("trainer.nan_check=loss", "trainer.grad_clip=1.0")],
    ids=["nan_check=grads", "grad_clip's norm"],
)
def test_finite_loss_with_nan_grads_is_skipped_where_the_gradients_are_checked(overrides, tmp_path):
    """nan_check=grads checks them; so does grad_clip's norm, under nan_check=loss too (clipping by
    a NaN norm would make every gradient NaN)."""
    from test_loop import _data, _mlp, _run

    x, y = _data(32)
    model = _mlp()
    _poison_first_grad_once(model)
    state = _run(model, x, y, batch_size=8, accum=1, tmp_path=tmp_path, overrides=overrides)
    assert state.skipped_steps == 1 and state.global_step == 4
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_non_finite_weights_are_never_checkpointed(tmp_path, monkeypatch):
    """nan_check=loss (the default) does not look at gradients: a finite loss with NaN gradients
    poisons the weights. The run must stop before writing them, and last.pt must be the good one."""
    from turbotrain.train import session as pipeline

    short = (*TINY, "precision=fp32", "trainer.limit_train_batches=6")
    train(make_cfg(*short, "trainer.max_epochs=1"), tmp_path)
    real_build = pipeline.build

    def build_and_poison(*args, **kwargs):
        parts = real_build(*args, **kwargs)
        _poison_first_grad_once(parts.model)
        return parts

    monkeypatch.setattr(pipeline, "build", build_and_poison)
    last = tmp_path / "checkpoints" / "last.pt"
    with pytest.raises(
        TrainingError, match=rf"not finite after step \d+ \(first: model\..*nan_check=grads.*last good checkpoint: {last}"
    ):
        train(make_cfg(*short, "trainer.max_epochs=2", "trainer.resume=auto"), tmp_path)
    ckpt = load(last)
    assert ckpt["state"]["global_step"] == 6 and not ckpt_io.nonfinite(ckpt)
    assert not ckpt_io.nonfinite(load(tmp_path / "checkpoints" / "best.pt"))


def _declare_huge(path) -> None:
    """Rewrite a real JPEG's frame header (SOF0) to declare 60000x60000 pixels: a few KB on disk,
    ~10 GB once decoded."""
    data = bytearray(path.read_bytes())
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = (60000).to_bytes(2, "big") * 2
    path.write_bytes(bytes(data))


def test_image_declaring_a_huge_size_is_a_bad_sample_and_a_corrupt_first_val_image_is_skipped(jpeg_tree, tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(jpeg_tree, tree)
    huge = tree / "train" / "flower" / "005.jpg"
    _declare_huge(huge)
    first_val = tree / "val" / "china" / "000.jpg"  # the first sample of the validation split
    first_val.write_bytes(first_val.read_bytes()[:200])
    run = tmp_path / "run"
    r = run_cli("train.py", *_tree_args(tree), "data.max_image_pixels=1000000", f"hydra.run.dir={run}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((run / "summary.json").read_text())["bad_samples"] == 1
    log = (run / "train.log").read_text()
    assert "005.jpg" in log and "declares 3600000000 pixels" in log and "data.max_image_pixels=1000000" in log


def test_empty_validation_split_is_one_line(jpeg_tree, tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(jpeg_tree, tree)
    for f in (tree / "val").rglob("*.jpg"):
        f.unlink()
    cfg = make_cfg(*_tree_args(tree))
    with pytest.raises(ConfigError) as err:
        train(cfg, tmp_path / "run")
    where = f"data.root={tree}: its val/ folder or val-*.tar shards"
    assert str(err.value) == f"data=imagenet: the validation split is empty ({where}): give it samples"
