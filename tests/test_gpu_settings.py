"""What a CUDA run sets and says, checked where it can be without a GPU: trainer.deterministic's
flags (a run sets them both ways), the line a CUDA resume logs without it, and gpu_util's one
warning when NVML fails. bench/gpu_check.sh checks the rest on a GPU (a deterministic resume
equals the uninterrupted run; gpu_util is a number)."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from conftest import TINY, make_cfg
from turbotrain.train.numerics import inexact_resume, set_kernels
from turbotrain.train.run import train

CUDA = torch.device("cuda", 0)


def _flags() -> tuple:
    return torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark


@pytest.fixture
def no_cublas_config(monkeypatch):
    """CUBLAS_WORKSPACE_CONFIG unset during the test, and what the test's run set removed after it."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")  # recorded as absent: undone by removing it
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")


def test_a_run_with_trainer_deterministic_sets_the_flags_and_the_next_job_clears_them(tmp_path, no_cublas_config):
    try:
        train(make_cfg(*TINY, "trainer.deterministic=true", "trainer.max_steps=2"), tmp_path / "a")
        assert _flags() == (True, True, False)
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"  # cuBLAS's fixed-order reductions
        assert torch.is_deterministic_algorithms_warn_only_enabled()  # an op without one warns, naming it
        train(make_cfg(*TINY, "trainer.max_steps=2"), tmp_path / "b")  # a sweep's next job, in this process
        assert _flags() == (False, False, False)  # benchmark is for CUDA only
    finally:
        set_kernels(False, torch.device("cpu"))


def test_cuda_times_cudnn_kernels_unless_deterministic(no_cublas_config):
    try:
        set_kernels(False, CUDA)  # sets flags only: no CUDA call
        assert _flags() == (False, False, True)
        set_kernels(True, CUDA)
        assert _flags() == (True, True, False)
    finally:
        set_kernels(False, torch.device("cpu"))


def test_only_a_cuda_resume_without_deterministic_says_it_is_not_bit_exact():
    assert "not bit-equal" in inexact_resume(CUDA, deterministic=False)
    assert "trainer.deterministic=true" in inexact_resume(CUDA, deterministic=False)
    assert inexact_resume(CUDA, deterministic=True) is None
    assert inexact_resume(torch.device("cpu"), deterministic=False) is None  # CPU resumes are exact (tested)


@pytest.mark.skipif(torch.cuda.is_available(), reason="NVML works here: gpu_check.sh checks the figure")
def test_gpu_util_without_nvml_is_null_and_warns_once(caplog):
    from turbotrain.train.tracking import _no_gpu_util, gpu_util

    _no_gpu_util.cache_clear()
    with caplog.at_level(logging.WARNING, logger="turbotrain"):
        assert [gpu_util(CUDA), gpu_util(CUDA)] == [None, None]
    lines = [r.getMessage() for r in caplog.records if "gpu_util" in r.getMessage()]
    assert len(lines) == 1 and "NVML" in lines[0], lines
    assert gpu_util(torch.device("cpu")) is None
