#!/usr/bin/env bash
# On a CUDA machine: `bash bench/gpu_check.sh` checks, in one run of under ten minutes on one GPU,
# what the CPU test suite can only emulate (bench/gpu_check.py: NCCL with autotune and
# loader=tuned, no host sync in training steps, fused SGD, a deterministic requeue equal to the
# uninterrupted run, nvJPEG against CPU workers, gpu_util, sync_bn on two GPUs). One verdict line
# per check; bench/results/gpu/gpu_check.json and gpu_check.log. Exits 1 when a check failed.
# `bash bench/gpu_check.sh --bench` then runs the benchmarks at GPU sizes (another ~8 minutes).
# Nothing to prepare beyond `make setup`.
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'gpu_check: no CUDA device here')"
export WANDB_MODE=disabled HF_HUB_OFFLINE=1
mkdir -p bench/results/gpu
exec > >(tee bench/results/gpu/gpu_check.log) 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
status=0
timeout 580 python -m bench.gpu_check || status=$?
if [ "${1:-}" = "--bench" ]; then
  timeout 540 python -m bench --gpu precision loader overhead text_precision skip_sync || echo "bench: stopped (time limit or error)"
fi
exit "$status"
