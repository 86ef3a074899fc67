"""The tests marked `cpu_path` (exact resume, whose numbers depend on the CPU's kernels) run again
in a fresh process capped to each lower instruction-set path this CPU has: ATen's vector kernels
(ATEN_CPU_CAPABILITY), oneDNN's (ONEDNN_MAX_CPU_ISA) and MKL's (MKL_ENABLE_INSTRUCTIONS). So an
AVX-512 machine also checks the AVX2 path, and an AMX Xeon the AVX-512 path without AMX; the
suite itself runs on the machine's own path, and amp's two CPU paths are the amp_path fixture's.
A path above this CPU's cannot be forced (its instructions would fault): it is skipped, saying so."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from turbotrain.core.cpu import cpu_flags
from turbotrain.train.precision import CPU_BF16_ENV

AVX512 = {"avx512f", "avx512bw", "avx512dq", "avx512vl"}
# path: (ATen capability, oneDNN's cap, MKL's cap, flags it needs, flags above it, amp's CPU path
# there: an AVX2 CPU has no bf16 units, so amp runs fp32 on it; None: what this CPU has)
PATHS = {
    "avx2": ("AVX2", "AVX2", "AVX2", {"avx2", "fma"}, {"avx512f"}, "0"),
    "avx512": ("AVX512", "AVX512_CORE_BF16", "AVX512", AVX512, {"amx_tile", "avx512_fp16"}, None),
}


@pytest.mark.parametrize("path", PATHS)
def test_cpu_path_tests_hold_on_each_lower_path_this_cpu_has(path):
    capability, onednn, mkl, needs, above, bf16 = PATHS[path]
    flags = cpu_flags() or frozenset()
    if not needs <= flags:
        pytest.skip(f"this CPU lacks {path} ({', '.join(sorted(needs - flags))}): a machine that has it runs this path")
    if torch.backends.cpu.get_cpu_capability() == capability and not above & flags:
        pytest.skip(f"{path} is this CPU's own path: the suite itself ran it")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": path, "ONEDNN_MAX_CPU_ISA": onednn, "MKL_ENABLE_INSTRUCTIONS": mkl}
    env.update({CPU_BF16_ENV: bf16} if bf16 is not None else {})
    cmd = [sys.executable, "-m", "pytest", "-m", "cpu_path", "-p", "no:cacheprovider", "-x", "tests"]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert f"cpu path: ATen {capability} ONEDNN_MAX_CPU_ISA={onednn}" in r.stdout, r.stdout[-2000:]
    assert r.returncode == 0 and " passed" in r.stdout.splitlines()[-1], r.stdout[-4000:]
