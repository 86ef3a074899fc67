"""trainer.malloc=retain: the memory a training step frees is reused by the next step, where
glibc's defaults hand much of it back to the kernel and take page faults to get it again."""

from __future__ import annotations

import subprocess
import sys

STEPS = """
import resource, sys, torch
from turbotrain.core.allocator import configure_malloc
configure_malloc(sys.argv[1])
torch.manual_seed(0)
conv = lambda i, o: [torch.nn.Conv2d(i, o, 3, padding=1), torch.nn.ReLU()]
model = torch.nn.Sequential(*conv(1, 32), *conv(32, 64), torch.nn.Flatten(), torch.nn.Linear(64 * 28 * 28, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(128, 1, 28, 28), torch.randint(0, 10, (128,))
def step():
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
for _ in range(10):  # warm-up: the allocator has seen every size (retain's heap settles in a few steps)
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(30):  # the defaults fault in bursts with quiet steps between: enough steps to see them
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _page_faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", STEPS, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


def test_retain_reuses_a_steps_freed_memory_without_page_faults():
    system, retain = _page_faults("system"), _page_faults("retain")
    assert system > 10_000  # the defaults fault pages in again every step (tens of thousands here)
    assert retain * 3 < system
