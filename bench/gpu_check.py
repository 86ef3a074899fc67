"""CUDA only: `python -m bench.gpu_check` (from bench/gpu_check.sh) runs, in under ten minutes on
one GPU, what the CPU test suite can only emulate, each check through `python train.py` as a user
runs it: NCCL with autotune and loader=tuned, no host sync inside training steps, SGD's fused
kernel, a deterministic requeue that ends with the uninterrupted run's weights, nvJPEG decoding
against CPU workers, NVML's gpu_util and (with two GPUs) sync_bn. One verdict line per check, and
bench/results/gpu/gpu_check.json, written after each check so that a killed run keeps the rest.
Exits 1 when a check failed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from omegaconf import OmegaConf

import turbotrain.options  # noqa: F401  (a checkpoint's config is checked against the registries)
from bench.common import ROOT, write
from turbotrain.core.checkpoint import load

BUDGET_S = 540  # the whole run, so that it fits a 10-minute device slot with start-up
SMALL = ("data=synthetic", "data.image_size=64", "data.batch_size=128", "model=resnet18", "trainer.progress_bar=false")
CHECKS: list[Callable[[Path, float], dict]] = []


def check(fn: Callable[[Path, float], dict]) -> Callable[[Path, float], dict]:
    CHECKS.append(fn)
    return fn


def _run(args: list[str], deadline: float, limit: float, env: dict | None = None) -> subprocess.CompletedProcess:
    timeout = max(1.0, min(limit, deadline - time.monotonic()))
    env = {**os.environ, "WANDB_MODE": "disabled", **(env or {})}
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def _train(run_dir: Path, *overrides: str, deadline: float, limit: float = 150, env: dict | None = None):
    return _run([sys.executable, "train.py", *overrides, f"hydra.run.dir={run_dir}"], deadline, limit, env)


def _failed(r: subprocess.CompletedProcess) -> dict:
    tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["(no output)"]
    return {"ok": False, "verdict": f"exit {r.returncode}: {tail[0][:300]}"}


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@check
def nccl_autotune(tmp: Path, deadline: float) -> dict:
    """A DDP world of one on NCCL with trainer.autotune and loader=tuned: every CPU-tensor collective
    must take the gloo side group (NCCL's default group has no CPU backend)."""
    run = tmp / "nccl"
    args = ("distributed=ddp", "distributed.nproc=1", "loader=tuned", "trainer.autotune=true", "data.num_samples=4096")
    r = _train(run, *SMALL, *args, "trainer.max_epochs=1", "trainer.log_every_n_steps=4", deadline=deadline)
    if r.returncode:
        return _failed(r)
    s = json.loads((run / "summary.json").read_text())
    return {
        "ok": s["world_size"] == 1 and s["device"].startswith("cuda"),
        "verdict": f"world {s['world_size']} on {s['device']}, autotune and loader=tuned ran, {s['samples_per_s']:.0f} samples/s",
    }


@check
def gpu_util(tmp: Path, deadline: float) -> dict:
    """NVML's utilization in the metrics of nccl_autotune's run (null there means NVML failed)."""
    if not (tmp / "nccl" / "metrics.jsonl").is_file():
        return {"ok": None, "verdict": "not run: nccl_autotune's run wrote no metrics"}
    util = sorted(e["gpu_util"] for e in _events(tmp / "nccl") if e.get("gpu_util") is not None)
    median = util[len(util) // 2] if util else None
    return {"ok": bool(util), "verdict": f"{len(util)} log steps with gpu_util, median {median}", "median": median}


@check
def no_sync_in_steps(tmp: Path, deadline: float) -> dict:
    """torch.cuda.set_sync_debug_mode("error") over the loop's steps, for each precision."""
    results = {}
    for precision in ("amp", "fp16", "bf16", "fp32"):  # amp is the default: fp16 with GradScaler on CUDA
        r = _run([sys.executable, "-m", "bench.sync_check", precision], deadline, 90)
        results[precision] = "ok" if r.returncode == 0 else _failed(r)["verdict"]
    bad = {k: v for k, v in results.items() if v != "ok"}
    return {"ok": not bad, "verdict": f"no host sync in steps for {', '.join(results)}" if not bad else f"syncs: {bad}"}


def _wait_for_step(proc: subprocess.Popen, metrics: Path, step: int, deadline: float) -> bool:
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.is_file():
            lines = metrics.read_text().splitlines()
            if any(e.get("split") == "train" and e.get("step", 0) >= step for e in map(json.loads, lines[:-1] or [])):
                return True
        time.sleep(0.02)
    return False


@check
def deterministic_requeue(tmp: Path, deadline: float) -> dict:
    """trainer.deterministic=true: SIGUSR2 mid-epoch (SLURM's warning), the requeued job
    (SLURM_RESTART_COUNT=1) continues; its last.pt equals the uninterrupted run's, bit for bit.
    The run's SGD must also have resolved optim.kernel=auto to fused (no foreach host reads)."""
    common = (*SMALL, "data.num_samples=32768", "data.batch_size=64", "trainer.deterministic=true")
    common = (*common, "trainer.max_epochs=1", "trainer.log_every_n_steps=1")
    full, cut = tmp / "full", tmp / "cut"
    if (r := _train(full, *common, deadline=deadline)).returncode:
        return _failed(r)
    args = [sys.executable, "train.py", *common, f"hydra.run.dir={cut}"]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    signalled = _wait_for_step(proc, cut / "metrics.jsonl", 40, deadline)
    if signalled:
        proc.send_signal(signal.SIGUSR2)
    _, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    if not signalled or proc.returncode != 128 + signal.SIGUSR2:
        return {"ok": False, "verdict": f"signalled={signalled}, exit {proc.returncode}: {err.strip()[-300:]}"}
    stopped_at = load(cut / "checkpoints" / "last.pt")["state"]["global_step"]
    if (r := _train(cut, *common, deadline=deadline, env={"SLURM_RESTART_COUNT": "1"})).returncode:
        return _failed(r)
    a, b = load(full / "checkpoints" / "last.pt"), load(cut / "checkpoints" / "last.pt")
    differ = [k for k in a["model"] if not torch.equal(a["model"][k], b["model"][k])]
    kernel = OmegaConf.create(a["config"]).optim.kernel  # the run's resolved choice (auto -> fused on CUDA)
    return {
        "ok": not differ and kernel == "fused",
        "verdict": f"stopped at step {stopped_at}, requeued: {len(differ)} of {len(a['model'])} tensors differ; "
        f"optim.kernel={kernel}",
        "sgd_fused": kernel == "fused",
    }


def _jpeg_tree(root: Path) -> None:
    """512 training JPEGs at 300x400 in 4 classes (a colour cast each), one of them with a header
    that declares 60000x60000: a bad sample on both paths, refused before any decode."""
    from torchvision.io import encode_jpeg

    g = torch.Generator().manual_seed(0)
    for split, n in (("train", 512), ("val", 64)):
        for c in range(4):
            d = root / split / f"c{c}"
            d.mkdir(parents=True)
            for i in range(n // 4):
                base = torch.randint(0, 256, (3, 12, 16), generator=g, dtype=torch.uint8)
                img = torch.nn.functional.interpolate(base[None].float(), size=(300, 400), mode="bilinear")[0]
                img[c % 3] = (img[c % 3] * 0.5 + 120).clamp(0, 255)
                (d / f"{i:04d}.jpg").write_bytes(encode_jpeg(img.to(torch.uint8), quality=90).numpy().tobytes())
    bomb = root / "train" / "c0" / "0000.jpg"
    data = bytearray(bomb.read_bytes())
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = (60000).to_bytes(2, "big") * 2
    bomb.write_bytes(bytes(data))


@check
def decode_gpu(tmp: Path, deadline: float) -> dict:
    """data.decode=gpu against data.decode=cpu, both with 4 loader workers: samples/s, and the one
    bad file counted once on each."""
    _jpeg_tree(tmp / "jpegs")
    common = (f"data.root={tmp / 'jpegs'}", "data.image_size=128", "data.batch_size=64", "loader.num_workers=4")
    common = ("data=imagenet", *common, "model=resnet18", "data.max_image_pixels=1000000", "trainer.max_epochs=3")
    rows = {}
    for decode in ("cpu", "gpu"):
        run = tmp / f"decode_{decode}"
        if (r := _train(run, *common, f"data.decode={decode}", "trainer.progress_bar=false", deadline=deadline)).returncode:
            return _failed(r)
        s = json.loads((run / "summary.json").read_text())
        rows[decode] = {k: s[k] for k in ("samples_per_s", "data_wait_frac", "bad_samples", "best_val_acc1")}
    ratio = rows["gpu"]["samples_per_s"] / rows["cpu"]["samples_per_s"]
    counted = all(row["bad_samples"] == 1 for row in rows.values())
    return {
        "ok": counted,
        "verdict": f"decode=gpu {ratio:.2f}x decode=cpu's samples/s (4 workers each, one run each); "
        f"bad samples {rows['cpu']['bad_samples']}/{rows['gpu']['bad_samples']} (want 1/1)",
        "rows": rows,
        "gpu_over_cpu": ratio,
    }


@check
def sync_bn(tmp: Path, deadline: float) -> dict:
    """distributed.sync_bn in 2 processes against 1 process on the same global batch (2 GPUs)."""
    if torch.cuda.device_count() < 2:
        return {"ok": None, "verdict": f"skipped: {torch.cuda.device_count()} GPU (NCCL puts one rank on each)"}
    same = ("data=synthetic", "data.image_size=64", "data.num_samples=1280", "model=resnet18", "precision=fp32")
    same = (*same, "trainer.max_epochs=1", "trainer.progress_bar=false")
    two = ("data.batch_size=32", "distributed=ddp", "distributed.nproc=2", "distributed.sync_bn=true")
    for run, extra in ((tmp / "sync_bn", two), (tmp / "one", ("data.batch_size=64",))):
        if (r := _train(run, *same, *extra, deadline=deadline)).returncode:
            return _failed(r)
    a, b = (load(tmp / d / "checkpoints" / "last.pt")["model"] for d in ("sync_bn", "one"))
    worst = max((a[k].double() - b[k].double()).abs().max().item() for k in a)
    return {
        "ok": worst < 1e-3,
        "verdict": f"largest weight difference to 1 process {worst:.2e} (float summation order only: < 1e-3)",
    }


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here")
        return 2
    deadline, results = time.monotonic() + BUDGET_S, {}
    (ROOT / "bench" / "results" / "gpu").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for fn in CHECKS:
            try:
                if deadline - time.monotonic() < 20:
                    result = {"ok": None, "verdict": "not run: out of the run's time"}
                else:
                    result = fn(Path(tmp), deadline)
            except subprocess.TimeoutExpired as e:
                result = {"ok": False, "verdict": f"timed out after {e.timeout:.0f} s"}
            results[fn.__name__] = result
            write("gpu/gpu_check", {"budget_s": BUDGET_S, "checks": results})
            mark = {True: "ok", False: "FAILED", None: "skipped"}[result["ok"]]
            print(f"{fn.__name__}: {mark}: {result['verdict']}", flush=True)
    return 1 if any(r["ok"] is False for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
