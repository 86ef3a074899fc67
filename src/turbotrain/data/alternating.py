"""Alternating flips (Keller Jordan's airbench): each training image is flipped in every other
epoch instead of at random. Half the images start flipped (which half: the run's seed); each then
alternates, so any two consecutive epochs show every image both ways, where random flips show a
quarter of them the same way twice. Whether sample i is flipped depends on (run seed, epoch, i)
alone: worker processes, batched or per-sample paths and a resume mid-epoch all agree.

SeededBatches (data/loader.py) says which epoch and sample a fetch is for (`fetching`): the op
has no other way to know, and outside a training loader it refuses to run."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from turbotrain.core.seeds import derived_seed

_MASK = (1 << 64) - 1
_fetch: dict[str, int | None] = {"seed": None, "epoch": None, "index": None}


@contextmanager
def fetching(seed: int, epoch: int, index: int | None = None) -> Iterator[None]:
    """Within it, flips are those of `epoch` of a run seeded `seed`; `index`: the one sample a
    per-sample transform is given (a batch's ops are given their indices)."""
    saved = dict(_fetch)
    _fetch.update(seed=seed, epoch=epoch, index=index)
    try:
        yield
    finally:
        _fetch.update(saved)


def _mix(x: int) -> int:
    """splitmix64's finalizer: every bit of x moves the low bit (derived_seed is linear in i)."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def flips(indices: Sequence[int] | None) -> list[bool]:
    """Whether each of the samples `indices` is flipped in the epoch being fetched."""
    seed, epoch = _fetch["seed"], _fetch["epoch"]
    if seed is None or epoch is None or indices is None:
        raise RuntimeError("AlternatingHorizontalFlip runs only in a training loader: it needs the epoch and the sample's index")
    return [bool((_mix(derived_seed(seed, int(i)) & _MASK) ^ epoch) & 1) for i in indices]


class AlternatingHorizontalFlip(v2.Transform):
    """`data.augment: [{name: AlternatingHorizontalFlip}]`, in place of RandomHorizontalFlip."""

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        index = _fetch["index"]
        return {"flip": flips(None if index is None else [index])[0]}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        return self._call_kernel(F.horizontal_flip, inpt) if params["flip"] else inpt
