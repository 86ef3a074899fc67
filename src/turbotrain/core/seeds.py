"""Seeds: the global one of a run, and the streams derived from it (epoch orders, resolution
draws, loader workers per rank), so each stream is reproducible and no two share one."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def derived_seed(seed: int, index: int, rank: int = 0) -> int:
    """The seed of stream `index` (an epoch, a step) of a run seeded `seed`, on `rank`. Rank 0's
    values are the same as a single-process run's."""
    return seed * 1_000_003 + index + 1_000_000_007 * rank
