"""What a host read per optimizer step costs: the loop's step (the non-finite flag goes into the
fused optimizer's kernel, counts read at log steps) against the same step plus one read of the
flag, which is what deciding the skip on the host costs (the loop did that until it moved to the
device). Short steps on a GPU show it most: the read drains the queue, so the next step's kernels
start only after the host has caught up. On a CPU the read is free and the ratio is ~1."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from bench.common import interleave, labelled, write


def _stepper(device: torch.device, batch: int, size: int, read_flag: bool):
    from turbotrain.train.loop import TrainState, _optimizer_step
    from turbotrain.train.optim import SGDConfig, sgd
    from turbotrain.train.precision import FP32_CPU

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * size * size, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)
    opt = sgd([{"params": list(model.parameters())}], SGDConfig())
    x, y = torch.randn(batch, 3, size, size, device=device), torch.randint(0, 10, (batch,), device=device)
    state = TrainState()

    def steps(n: int) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            bad = ~torch.isfinite(loss.detach())
            if read_flag:
                bool(bad)  # the host read this bench prices
            state.count_skip(_optimizer_step(model, opt, None, FP32_CPU, None, bad))
        state.read_skips()
        return n / (time.perf_counter() - t0)

    return steps


def run(repeats: int = 5, steps: int = 200, batch: int = 32, size: int = 32) -> Path:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    arms = {"flag on the device": False, "flag read on the host": True}
    runners = {name: _stepper(device, batch, size, read) for name, read in arms.items()}
    for fn in runners.values():
        fn(20)  # warm-up
    results = interleave({name: (lambda fn=fn: fn(steps)) for name, fn in runners.items()}, repeats)
    label = (f"optimizer steps/s on {device.type}, MLP on batch {batch} @{size}px: skip flag on the device vs read per step", "-")
    rows = labelled([label], figures({"results": results}))
    return write("skip_sync", {"device": device.type, "steps": steps, "results": results, "rows": rows})


def figures(result: dict) -> list[dict]:
    device, host = (result["results"][k]["median"] for k in ("flag on the device", "flag read on the host"))
    return [{"ours": f"{device / host:.2f}x ({device:.0f} vs {host:.0f} steps/s)", "ratio": device / host}]
