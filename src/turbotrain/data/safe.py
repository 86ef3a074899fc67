"""Bad samples: skip and count them (`data.on_bad_sample=skip`) or stop naming the file (`error`)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from torch.utils.data import Dataset, default_collate

from turbotrain.core.errors import UserError

log = logging.getLogger("turbotrain")
WARN_FIRST = 5


class DataError(UserError, RuntimeError):
    """A sample could not be read or decoded; the message names it."""


class SafeDataset(Dataset):
    """Wraps a dataset so a sample that fails to load becomes None (skip) or a DataError naming
    it (error). `name_of(i)` names sample i (its file path, its line)."""

    def __init__(self, dataset: Dataset, policy: str, name_of: Callable[[int], str]):
        self.dataset, self.policy, self.name_of = dataset, policy, name_of
        self.bad = 0  # per process: workers count their own

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int):
        try:
            return self.dataset[i]
        except Exception as e:  # decoding errors come from PIL, libjpeg, torchvision.io, ...
            message = f"bad sample {self.name_of(i)}: {type(e).__name__}: {e}"
            if self.policy == "error":
                raise DataError(message + " (data.on_bad_sample=skip skips such samples)") from e
            self.bad += 1
            if self.bad <= WARN_FIRST:
                log.warning("skipping %s", message)
            return None


def collate_skipping_bad(batch: list):
    """default_collate of the good samples, plus how many were dropped: (inputs, target, n_bad)."""
    good = [b for b in batch if b is not None]
    if not good:
        raise DataError(f"all {len(batch)} samples of a batch failed to load; is data.root the right tree?")
    inputs, target = default_collate(good)
    return inputs, target, len(batch) - len(good)
