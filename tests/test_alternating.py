"""Alternating flips: each training image flipped in every other epoch, half of them from the
first, the same on every data path (batched, per sample, worker processes)."""

from __future__ import annotations

import pytest
import torch
from torchvision import tv_tensors

from conftest import make_cfg
from turbotrain.data import build_data
from turbotrain.data.alternating import AlternatingHorizontalFlip
from turbotrain.data.loader import EpochSampler, build_loader, epoch_seed_cell, set_epoch_seed

DIGITS = ("data=digits", "data.augment=[{name: AlternatingHorizontalFlip}]")  # real 8x8 scans, 1,797 of them


def _flipped(*overrides: str, run_seed: int = 0, epochs: int = 2) -> list[dict[int, bool]]:
    """Per epoch: whether each training sample came out flipped (compared with the stored
    image), from the training loader as a run builds it."""
    cfg = make_cfg(*DIGITS, *overrides)
    data = build_data(cfg.data)
    cell, sampler = epoch_seed_cell(), EpochSampler(len(data.train), run_seed)
    common = {"batch_size": 64, "loader_cfg": cfg.loader, "device": torch.device("cpu"), "train": True}
    loader = build_loader(data.train, sampler=sampler, epoch_seed=cell, collate_fn=data.collate, **common)
    stored, out = data.train.images.float(), []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        set_epoch_seed(cell, run_seed, epoch, rank=0)
        order, seen = list(sampler), {}
        for x, _ in loader:
            for image in x:
                i = order[len(seen)]
                pixels = image * data.collate.std[0] + data.collate.shift[0]
                plain, mirrored = (torch.allclose(pixels, s, atol=1e-3) for s in (stored[i], stored[i].flip(-1)))
                assert plain != mirrored or torch.equal(stored[i], stored[i].flip(-1)), f"sample {i} changed otherwise"
                seen[i] = mirrored and not plain
        out.append(seen)
    return out


def _asymmetric(flips: dict[int, bool]) -> dict[int, bool]:
    images = build_data(make_cfg(*DIGITS).data).train.images
    return {i: f for i, f in flips.items() if not torch.equal(images[i], images[i].flip(-1))}


def test_each_image_is_flipped_in_every_other_epoch_half_of_them_first():
    first, second, third = _flipped(epochs=3)
    first = _asymmetric(first)
    shared = [i for i in first if i in second and i in third]
    assert len(shared) > 0.9 * len(first) > 1000
    assert all(second[i] != first[i] and third[i] == first[i] for i in shared)
    assert 0.4 < sum(first.values()) / len(first) < 0.6


def test_the_run_seed_chooses_which_half_starts_flipped():
    (a,), (b,) = _flipped(run_seed=0, epochs=1), _flipped(run_seed=1, epochs=1)
    same = [i for i in _asymmetric(a) if i in b]
    assert 0.3 < sum(a[i] == b[i] for i in same) / len(same) < 0.7


@pytest.mark.parametrize("path", ["loader.batched=false", "loader.num_workers=1"], ids=["per_sample", "worker"])
def test_every_loader_path_flips_the_batched_paths_samples(path):
    """Per sample (the op is told each sample's index) and in a persistent worker process (which
    must see the second epoch's number through the shared cell), the same images are flipped."""
    assert _flipped(path) == _flipped()


def test_outside_a_training_loader_it_refuses_to_guess():
    with pytest.raises(RuntimeError, match="only in a training loader"):
        AlternatingHorizontalFlip()(tv_tensors.Image(torch.zeros(1, 4, 4, dtype=torch.uint8)))


def test_each_run_seed_epoch_and_rank_has_its_own_augmentation_stream():
    """set_epoch_seed's first field seeds a batch's draws: two runs, two epochs or two DDP ranks
    sharing one would augment alike (the ranks: the same crops and flips on their two halves of
    the batch). The other two fields are the epoch and the run seed that alternating flips read."""
    cells = {}
    for key in [(0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1)]:  # (run seed, epoch, rank)
        cell = epoch_seed_cell()
        set_epoch_seed(cell, *key)
        cells[key] = cell.tolist()
    assert len({seed for seed, _, _ in cells.values()}) == len(cells)
    assert [(epoch, run_seed) for _, epoch, run_seed in cells.values()] == [(0, 0), (0, 1), (1, 0), (0, 0)]
