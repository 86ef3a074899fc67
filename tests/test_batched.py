"""Whole-batch indexing of in-memory images: one index into the tensor store per batch and
augmentation per batch must give exactly the per-sample path's batches."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

from conftest import make_cfg
from turbotrain.data import build_data
from turbotrain.data.batched import batch_pipeline
from turbotrain.data.loader import EpochSampler, build_loader, epoch_seed_cell


def _batches(cfg, n: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    data = build_data(cfg.data)
    epoch_seed = epoch_seed_cell()
    epoch_seed.fill_(7)  # each batch's augmentation draws are seeded from it
    loader = build_loader(
        data.train,
        batch_size=64,
        sampler=EpochSampler(len(data.train), 0),
        loader_cfg=cfg.loader,
        device=torch.device("cpu"),
        train=True,
        epoch_seed=epoch_seed,
        collate_fn=data.collate,
    )
    out = []
    for x, y, *_ in loader:  # the per-sample file path adds its count of bad files
        out.append((x, y))
        if len(out) == n:
            return out
    return out


@pytest.mark.parametrize(
    "overrides",
    [
        (),  # Fashion-MNIST with its flip: the default run
        ("experiment=resnet18_fashion",),  # resized to 64 px (one Resize of the batch), then the flip
        ("data=digits", "data.image_size=16", "data.augment=[{name: RandomVerticalFlip, p: 0.3}]"),
        ("data=synthetic", "data.num_samples=256"),
    ],
    ids=["fashion_mnist", "resnet18_fashion", "digits_resize_vflip", "synthetic"],
)
def test_batched_loader_gives_the_per_sample_batches(overrides):
    batched = _batches(make_cfg(*overrides))
    per_sample = _batches(make_cfg(*overrides, "loader.batched=false"))
    assert len(batched) == len(per_sample) > 0
    for (xb, yb), (xs, ys) in zip(batched, per_sample, strict=True):
        assert torch.equal(yb, ys) and torch.equal(xb, xs)


def test_flips_drawn_for_the_whole_batch_at_once_are_the_per_sample_draws():
    images = torch.randint(0, 256, (16, 3, 5, 7), dtype=torch.uint8)
    ops = [v2.RandomHorizontalFlip(0.5), v2.RandomVerticalFlip(0.3)]
    torch.manual_seed(5)
    batched = batch_pipeline(ops)(images)
    after_batched = torch.rand(1)
    torch.manual_seed(5)
    per_sample = torch.stack([v2.Compose(ops)(tv_tensors.Image(i)).as_subclass(torch.Tensor) for i in images])
    assert torch.equal(batched, per_sample)
    assert torch.equal(after_batched, torch.rand(1))  # the same numbers consumed: later draws agree too


def test_ops_without_a_batch_form_run_per_sample_with_the_same_draws():
    images = torch.randint(0, 256, (8, 3, 12, 12), dtype=torch.uint8)
    ops = [v2.RandomHorizontalFlip(0.5), v2.RandomRotation(30)]
    torch.manual_seed(3)
    batched = batch_pipeline(ops)(images)
    torch.manual_seed(3)  # per sample: flip draws for all samples first, then the rotations
    flipped = batch_pipeline(ops[:1])(images)
    rotated = torch.stack([ops[1](tv_tensors.Image(i)).as_subclass(torch.Tensor) for i in flipped])
    assert torch.equal(batched, rotated)
    assert not torch.equal(batched, images)


@pytest.mark.parametrize("flip", ["RandomHorizontalFlip", "AlternatingHorizontalFlip"])
def test_cached_batches_are_the_per_sample_batches_of_the_jpeg_files(jpeg_tree, tmp_path, flip):
    """RandomResizedCrop and flip drawn sample by sample, as the per-sample path does (an
    alternating flip: from each sample's index): from a cache that keeps the files' own pixels
    (no side above 200 px), the batched crops are the per-sample path's crops."""
    common = ("data=imagenet", f"data.root={jpeg_tree}", "data.image_size=48", f"data.augment=[{{name: {flip}}}]")
    cached = _batches(make_cfg(*common, "data.cache=raw", "data.cache_size=200", f"data.cache_dir={tmp_path}"))
    per_sample = _batches(make_cfg(*common))
    assert len(cached) == len(per_sample) > 0
    for (xc, yc), (xs, ys) in zip(cached, per_sample, strict=True):
        assert torch.equal(yc, ys)
        torch.testing.assert_close(xc, xs, atol=1e-6, rtol=0)  # normalized per batch vs per sample


def _draws() -> tuple[list[int], list[float]]:
    return np.random.randint(0, 2**31, size=4).tolist(), [random.random() for _ in range(4)]


def test_each_worker_seeds_numpy_and_random_from_its_torch_seed():
    """A worker's numpy and random streams (user augmentations draw from them) follow the seed
    torch gives that worker (the loader's base seed + worker id, a 64-bit number): the same seed
    repeats them, another worker's seed changes them."""
    cfg = make_cfg("loader.num_workers=1")
    loader = build_loader(
        torch.arange(8),
        batch_size=4,
        sampler=None,
        loader_cfg=cfg.loader,
        device=torch.device("cpu"),
        train=True,
        epoch_seed=None,
        collate_fn=None,
    )
    seeded = []
    for worker, torch_seed in enumerate((2**40 + 2**32 + 5, 2**40 + 2**32 + 6)):  # bits above 31 set, 32 too
        torch.manual_seed(torch_seed)  # as torch does in worker `worker` before calling the hook
        loader.worker_init_fn(worker)
        seeded.append(_draws())
        np.random.seed(torch_seed % 2**32)
        random.seed(torch_seed % 2**32)
        assert seeded[-1] == _draws()
    assert seeded[0] != seeded[1]
