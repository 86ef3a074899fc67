"""The reference for pipeline overhead: a minimal hand-written PyTorch loop (what a user would write),
same model, precision and threads as the turbotrain run it is compared with. Prints one JSON line."""

import json
import os
import sys
import time
from pathlib import Path

import torch
import torchvision


def process_age_s() -> float:  # as turbotrain.train.tracking's, without importing the project
    stat = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    boot = next(int(x.split()[1]) for x in Path("/proc/stat").read_text().splitlines() if x.startswith("btime"))
    return time.time() - (boot + int(stat[19]) / os.sysconf("SC_CLK_TCK"))


steps, batch, size = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
n = batch * (steps + 8)  # as many samples as train.py's epoch: the same memory traffic, no cache-resident toy set
x = torch.rand(n, 3, size, size)
x = (x - 0.5) / 0.29
y = torch.randint(0, 10, (n,))
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch, shuffle=True, drop_last=True)
cuda = torch.cuda.is_available()  # as train.py's precision=amp: fp16 + GradScaler on CUDA, bf16 on CPU
device = torch.device("cuda" if cuda else "cpu")
model = torchvision.models.resnet18(num_classes=10).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
scaler = torch.amp.GradScaler("cuda") if cuda else None
ends, first = [], None  # step end times: rates include data loading, as train.py's do
done = 0
while done < steps:
    for xb, yb in loader:
        xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.float16 if cuda else torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(xb).float(), yb)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        done += 1
        if first is None:
            first = process_age_s()
        ends.append(time.perf_counter())
        if done >= steps:
            break
steady = ends[len(ends) // 4 :]
print(json.dumps({"first_step_s": first, "samples_per_s": batch * (len(steady) - 1) / (steady[-1] - steady[0])}))
