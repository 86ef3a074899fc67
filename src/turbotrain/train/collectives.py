"""Collectives of a DDP run, each on the group its tensor's device needs: a CPU tensor over the
gloo side group (DistInfo.cpu_group), a device tensor over the default group (NCCL on GPUs, which
has no CPU backend). Without a process group each returns its input as one rank's."""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from torch import nn

from turbotrain.train.distributed import DistInfo


def _group_for(t: torch.Tensor, cpu_group):
    """The group a collective on `t` goes over: the gloo side group for a CPU tensor, else the default."""
    return cpu_group if t.device.type == "cpu" else None


def all_reduce_sum(t: torch.Tensor, cpu_group=None) -> torch.Tensor:
    """`t` summed over the ranks, over the group its device needs."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=_group_for(t, cpu_group))
    return t


def summer(info: DistInfo):
    """t -> t summed over the ranks, each tensor over its device's group; None without DDP."""
    return functools.partial(all_reduce_sum, cpu_group=info.cpu_group) if info.enabled else None


def gather_floats(values: list[float], cpu_group=None) -> list[list[float]]:
    """Every rank's `values`, on every rank (one row per rank), over the CPU group."""
    t = torch.tensor(values, dtype=torch.float64)
    if not (dist.is_available() and dist.is_initialized()):
        return [t.tolist()]
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t, group=cpu_group)
    return [o.tolist() for o in out]


def balance_warning(rows: list[list[float]], names: tuple[str, ...], tolerance: float = 0.10) -> str | None:
    """A warning when ranks differ by more than `tolerance` in any figure (the seed's rule)."""
    problems = []
    for i, name in enumerate(names):
        column = [r[i] for r in rows]
        low, high = min(column), max(column)
        if low > 0 and high / low - 1 > tolerance:
            problems.append(f"{name} {low:.1f}..{high:.1f} ({100 * (high / low - 1):.0f}% apart)")
    return "ranks are unbalanced: " + "; ".join(problems) if problems else None


def agree_max(values: list[int], group=None) -> list[int]:
    """Each of `values`, the largest over all ranks (the values themselves without DDP), over
    `group`, DistInfo.cpu_group: a CPU all-reduce each step that never waits for a GPU's queue."""
    if not (dist.is_available() and dist.is_initialized()):
        return values
    t = torch.tensor(values, dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.tolist()


def gather_objects(obj, cpu_group=None) -> list:
    """Every rank's `obj`, on every rank, in rank order (pickled into CPU tensors: the CPU group)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=cpu_group)
    return out


def broadcast_buffers(module: nn.Module, info: DistInfo) -> None:
    """Rank 0's buffers (BatchNorm's running statistics) on every rank. DDP broadcasts them at the
    start of each training forward, but that forward then updates each rank's own: without this,
    each rank would validate its shard, and average its EMA, with different statistics than the
    model rank 0 saves."""
    if not info.enabled:
        return
    for b in module.buffers():
        dist.broadcast(b, src=0, group=_group_for(b, info.cpu_group))
