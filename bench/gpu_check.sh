#!/usr/bin/env bash
# On a CUDA machine: the speed checks at GPU sizes in one short run (~8 minutes on one GPU).
# fp16 autocast + GradScaler (precision=amp on CUDA), TF32, pinned memory, NCCL; results go to
# bench/results/gpu/*.json and a log. Nothing to prepare beyond `make setup`.
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'gpu_check: no CUDA device here')"
export WANDB_MODE=disabled HF_HUB_OFFLINE=1
mkdir -p bench/results/gpu
exec > >(tee bench/results/gpu/gpu_check.log) 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
run_dir=$(mktemp -d)

echo "== 1. NCCL DDP + fp16 GradScaler + TF32 + pinned memory, end to end (1 process per GPU)"
ngpu=$(python -c "import torch; print(torch.cuda.device_count())")
timeout 120 python train.py data=synthetic data.image_size=128 data.num_samples=4096 data.batch_size=128 \
    model=resnet18 precision=amp precision.tf32=true distributed=ddp distributed.nproc="$ngpu" \
    trainer.max_epochs=1 trainer.progress_bar=false hydra.run.dir="$run_dir/ddp"
python - "$run_dir/ddp/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print({k: s[k] for k in ("device", "world_size", "precision", "samples_per_s", "peak_mem_mb", "skipped_steps")})
PY

echo "== 2. trainer.autotune at GPU size (channels_last x compile, workers)"
timeout 150 python train.py data=synthetic data.image_size=160 data.num_samples=8192 data.batch_size=128 \
    model=resnet50 precision=amp trainer.autotune=true 'loader.auto_candidates=[0,4,8]' \
    trainer.max_epochs=1 trainer.progress_bar=false hydra.run.dir="$run_dir/autotune" | grep -A8 "trainer.autotune" || true

echo "== 3. benchmarks at GPU sizes"
timeout 300 python -m bench --gpu precision loader overhead text_precision || echo "bench: stopped (time limit or error)"
ls -l bench/results/gpu/
