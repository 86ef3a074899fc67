"""Shared fixtures: Hydra compose without a run, tiny real datasets."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import turbotrain.options  # noqa: F401  (fills the option registries)
from turbotrain.config import register_configs
from turbotrain.train.precision import CPU_BF16_ENV

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
register_configs()


def pytest_report_header(config) -> str:
    """The CPU path this session runs on (test_cpu_paths.py reads it back from a capped run)."""
    caps = " ".join(f"{k}={os.environ[k]}" for k in ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS") if k in os.environ)
    return f"cpu path: ATen {torch.backends.cpu.get_cpu_capability()} {caps}".rstrip()


@pytest.fixture(autouse=True)
def environment_unchanged():
    """A test leaves this process's environment as it found it (monkeypatch's own changes are undone
    before this runs): what a run set here would reach every later test's subprocesses."""
    before = dict(os.environ)
    yield
    # pytest's own (the test's phase), and what sklearn/joblib set when a test first imports them
    keys = {*before, *os.environ} - {"PYTEST_CURRENT_TEST", "KMP_INIT_AT_FORK", "KMP_DUPLICATE_LIB_OK"}
    changed = {k: os.environ.get(k) for k in keys if before.get(k) != os.environ.get(k)}
    assert not changed, f"the test left these variables changed: {changed}"


def make_cfg(*overrides: str, config_name: str = "train"):
    """Compose conf/<config_name>.yaml exactly as the entry point would (no run dir)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides))


def run_cli(script: str, *args: str, cwd: Path | None = None, timeout: int = 600, env: dict | None = None):
    """Run an entry point in a fresh process (environment: `env` or this one's); returns
    CompletedProcess (text)."""
    env = {**(os.environ if env is None else env), "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, str(ROOT / script), *args],
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def checkpoint(**given) -> dict:
    """A checkpoint dict as core/checkpoint.payload writes it, with only `given` set (an optimizer
    without state, the rest empty): what reads it back meets the writer's own keys."""
    from turbotrain.core.checkpoint import payload

    empty = dict.fromkeys(("state_dict", "scheduler", "scaler", "state", "config_yaml", "arch", "metrics"))
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    return payload(**{**empty, "optimizer": optimizer, "rng": [{}], **given})


TINY = (
    "data=digits",
    "model=small_cnn",
    "model.width=8",
    "trainer.progress_bar=false",
    "trainer.log_every_n_steps=5",
)


@pytest.fixture(scope="session")
def jpeg_tree(tmp_path_factory) -> Path:
    """An ImageNet-layout tree of real JPEGs: crops of scikit-learn's two sample photos
    (china.jpg, flower.jpg), re-encoded with PIL. Two visually distinct classes."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_sample_images

    root = tmp_path_factory.mktemp("jpeg_tree")
    photos = load_sample_images()
    rng = np.random.default_rng(0)
    for cls, img in zip(("china", "flower"), photos.images):
        h, w, _ = img.shape
        for split, n in (("train", 48), ("val", 16)):
            d = root / split / cls
            d.mkdir(parents=True)
            for i in range(n):
                s = int(rng.integers(96, 200))
                y, x = int(rng.integers(0, h - s)), int(rng.integers(0, w - s))
                Image.fromarray(img[y : y + s, x : x + s]).save(d / f"{i:03d}.jpg", quality=90)
    return root


@pytest.fixture(scope="session")
def jpeg_formats(jpeg_tree, tmp_path_factory) -> Path:
    """jpeg_tree as WebDataset shards of 10 samples (shards/), as a save_to_disk folder (disk/) and
    as Parquet files (parquet/), written by turbotrain's converter and by datasets itself."""
    import datasets

    from turbotrain.data.shards import convert

    out = tmp_path_factory.mktemp("formats")
    convert(jpeg_tree, out / "shards", per_shard=10)
    loaded = datasets.load_dataset("imagefolder", data_dir=str(jpeg_tree), cache_dir=str(out / "hf_cache"))
    loaded.save_to_disk(str(out / "disk"))
    for split, ds in loaded.items():
        ds.to_parquet(str(out / "parquet" / f"{split}-00000-of-00001.parquet"))
    return out


@pytest.fixture(params=["bf16", "fp32"])
def amp_path(request, monkeypatch) -> str:
    """Runs a test once on each CPU path of `precision=amp` (bf16 where the CPU has it, else
    fp32), whatever this CPU has: a test whose expectation depends on the path takes this."""
    monkeypatch.setenv(CPU_BF16_ENV, "1" if request.param == "bf16" else "0")
    return request.param
