"""DataLoader construction and the epoch-seeded sampler that makes resume exact."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from turbotrain.core.registry import Registry
from turbotrain.core.schema import NON_NEGATIVE, POSITIVE, setting
from turbotrain.core.seeds import derived_seed
from turbotrain.data.alternating import fetching

BUCKET_SPAN = 50  # length bucketing sorts windows of this many batches


def bucket_by_length(order: list[int], lengths: list[int], batch: int, g: torch.Generator) -> list[int]:
    """Reorder a shuffled `order` so each run of `batch` indices has similar lengths (little
    padding): sort windows of BUCKET_SPAN batches by length, cut them into batches, shuffle the
    full batches and put the short one last (so the DataLoader's batches stay aligned with them)."""
    span = batch * BUCKET_SPAN
    batches = []
    for i in range(0, len(order), span):
        window = sorted(order[i : i + span], key=lambda j: lengths[j], reverse=True)
        batches += [window[k : k + batch] for k in range(0, len(window), batch)]
    full = [b for b in batches if len(b) == batch]
    short = [b for b in batches if len(b) < batch]
    return [j for k in torch.randperm(len(full), generator=g).tolist() for j in full[k]] + [j for b in short for j in b]


class EpochSampler(Sampler[int]):
    """Shuffles with a generator seeded by (seed, epoch), so epoch k's order does not
    depend on what ran before it, and can start `start` samples into the epoch
    (mid-epoch resume). Rank-aware: rank r of w takes every w-th index of the
    (padded) permutation, like DistributedSampler. With `lengths` (text), batches of
    `batch_size` are formed from samples of similar length (see bucket_by_length); unshuffled,
    the samples come longest first."""

    def __init__(
        self,
        n: int,
        seed: int,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
        pad: bool = True,
        lengths: list[int] | None = None,
        batch_size: int = 1,
    ):
        self.n, self.seed, self.shuffle, self.pad = n, seed, shuffle, pad
        self.rank, self.world_size = rank, world_size
        self.lengths, self.batch_size = lengths, batch_size
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def _indices(self) -> list[int]:
        if self.shuffle:
            g = torch.Generator().manual_seed(derived_seed(self.seed, self.epoch))
            order = torch.randperm(self.n, generator=g).tolist()
            if self.lengths is not None:  # a global batch = batch_size from each rank, strided
                order = bucket_by_length(order, self.lengths, self.batch_size * self.world_size, g)
        elif self.lengths is not None:  # evaluation: longest first, so each batch pads to little
            order = sorted(range(self.n), key=lambda j: -self.lengths[j])
        else:
            order = list(range(self.n))
        if self.pad:  # equal shards (training: every rank takes the same number of steps)
            order += order[: -(-self.n // self.world_size) * self.world_size - self.n]
        return order[self.rank :: self.world_size]

    def __iter__(self) -> Iterator[int]:
        return iter(self._indices()[self.start :])

    def __len__(self) -> int:
        per_rank = -(-self.n // self.world_size) if self.pad else len(range(self.rank, self.n, self.world_size))
        return per_rank - self.start


def _seed_worker(worker_id: int) -> None:
    # torch seeds each worker from the loader's generator; numpy/random follow it.
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


LOADERS = Registry("loader")


class PerSample(Dataset):
    """A dataset seen one sample at a time (loader.batched=false): hides its `__getitems__`."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int):
        return self.dataset[i]


class SeededBatches(Dataset):
    """Fetches each batch with torch's CPU RNG seeded from the epoch's seed and the batch's first
    sample (and restored after), so a batch's augmentation depends on (seed, epoch, rank, its
    samples) alone, not on the process that fetches it nor on what that process fetched before:
    worker processes, persistent or not and any number of them, give the numbers of none, and a
    resume at any step draws what the uninterrupted run drew. `epoch_seed`: an epoch_seed_cell,
    read at each batch (persistent workers live across epochs; it is set before each); its epoch
    and run seed decide alternating flips (data/alternating.py), told the samples fetched."""

    def __init__(self, dataset: Dataset, epoch_seed: torch.Tensor):
        self.dataset, self.epoch_seed = dataset, epoch_seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, indices: list[int]) -> list:
        seed, epoch, run_seed = self.epoch_seed.tolist()
        # the main process's stream (dropout, mixing) goes on untouched. devices=[]: forking the CUDA
        # generators would start CUDA in a forked worker, which only a GPU shows (exempt from mutation)
        with torch.random.fork_rng(devices=[]):  # pragma: no mutate
            # not torch.manual_seed: that reseeds CUDA too
            torch.default_generator.manual_seed(derived_seed(seed, indices[0]) % 2**63)
            if getattr(self.dataset, "__getitems__", None):
                with fetching(run_seed, epoch):
                    return self.dataset.__getitems__(indices)
            out = []
            for i in indices:
                with fetching(run_seed, epoch, index=i):
                    out.append(self.dataset[i])
            return out


def epoch_seed_cell() -> torch.Tensor:
    """The cell SeededBatches reads, [the epoch's augmentation seed, the epoch, the run's seed]:
    in shared memory, so worker processes see each epoch's values (set_epoch_seed)."""
    return torch.zeros(3, dtype=torch.int64).share_memory_()


def set_epoch_seed(cell: torch.Tensor, run_seed: int, epoch: int, rank: int) -> None:
    """An augmentation stream per epoch and rank: ranks must not share one."""
    cell.copy_(torch.tensor([derived_seed(run_seed, epoch + 1, rank), epoch, run_seed]))


@dataclass
class LoaderConfig:
    name: str = "default"  # the option (loader=<name>)
    num_workers: int = setting(0, bound=NON_NEGATIVE)  # DataLoader worker processes; 0: load in the training process
    auto_workers: bool = False  # time training steps with each of auto_candidates at start, keep the fastest
    auto_candidates: list[int] = setting(bound=NON_NEGATIVE, factory=lambda: [0, 1, 2, 4])  # worker counts trainer.autotune tries
    pin_memory: bool | None = None  # None: when training on CUDA
    persistent_workers: bool = True  # keep workers alive between epochs
    prefetch_factor: int | None = setting(None, bound=POSITIVE)  # batches each worker loads ahead
    batched: bool = True  # a batch is one index into datasets that can (in-memory images); false: per sample


@dataclass
class TunedLoaderConfig(LoaderConfig):
    num_workers: int = setting(2, bound=NON_NEGATIVE)
    auto_workers: bool = True
    prefetch_factor: int | None = setting(4, bound=POSITIVE)


def build_loader(
    dataset: Dataset,
    *,
    batch_size: int,
    sampler: Sampler | None,
    loader_cfg,
    device: torch.device,
    train: bool,
    epoch_seed: torch.Tensor | None = None,
    collate_fn=None,
    on_device=None,
) -> DataLoader:
    """With `epoch_seed` (an epoch_seed_cell), batches are fetched through SeededBatches; with
    `on_device` (DataBundle.train_on_device), the main process finishes each batch on `device`."""
    loader = LOADERS.of(loader_cfg).build(
        dataset, batch_size, sampler, loader_cfg, device, train, epoch_seed=epoch_seed, collate_fn=collate_fn
    )
    return on_device(loader, device=device) if on_device is not None else loader


@LOADERS.register("default", LoaderConfig)
@LOADERS.register("tuned", TunedLoaderConfig)
def torch_loader(dataset, batch_size, sampler, loader_cfg, device, train, *, epoch_seed, collate_fn) -> DataLoader:
    """torch's DataLoader with the configured workers (loader=tuned: also timed at start, see autotune)."""
    workers = int(loader_cfg.num_workers)
    if not loader_cfg.batched and getattr(dataset, "__getitems__", None):
        dataset = PerSample(dataset)
    if epoch_seed is not None:
        dataset = SeededBatches(dataset, epoch_seed)
    pin = loader_cfg.pin_memory if loader_cfg.pin_memory is not None else device.type == "cuda"
    kwargs = {}
    if workers > 0:
        kwargs = {
            "persistent_workers": bool(loader_cfg.persistent_workers),
            "worker_init_fn": _seed_worker,
        }
        if loader_cfg.prefetch_factor:
            kwargs["prefetch_factor"] = int(loader_cfg.prefetch_factor)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        shuffle=False,
        num_workers=workers,
        pin_memory=bool(pin),
        drop_last=train,  # equal micro-batches make gradient-accumulation scaling exact
        # the workers' base seed; without a generator it is drawn from the global RNG at each
        # iteration, shifting the main process's stream (dropout, mixing) between runs and resumes
        generator=torch.Generator().manual_seed(0),
        collate_fn=collate_fn,
        **kwargs,
    )
