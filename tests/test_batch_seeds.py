"""data.loader.SeededBatches on its own: a batch's draws come from (the epoch's seed, its first
sample), so other batches draw otherwise, a batch of one is fetched like any other, and any
trainer.seed a user may give is a valid generator seed (the whole-run reproducibility tests are
in test_alternating.py and test_resume.py)."""

import torch
from torch.utils.data import Dataset

from turbotrain.data.loader import SeededBatches, epoch_seed_cell, set_epoch_seed


class Draws(Dataset):
    """Each sample is one draw of torch's CPU RNG, as a random augmentation's."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        return torch.rand(()).item()


def _batches(run_seed: int) -> SeededBatches:
    cell = epoch_seed_cell()
    set_epoch_seed(cell, run_seed, epoch=1, rank=0)
    return SeededBatches(Draws(), cell)


def test_a_batch_draws_from_its_first_sample_and_other_batches_draw_otherwise():
    batches = _batches(run_seed=3)
    first = batches.__getitems__([0, 1])
    assert batches.__getitems__([0, 1]) == first  # whatever was drawn before
    assert batches.__getitems__([0]) == first[:1]  # a batch of one: the same first draw
    others = [batches.__getitems__([i, 0])[0] for i in range(2, 8, 2)]
    assert len({first[0], *others}) == 4


def test_any_run_seed_gives_valid_generator_seeds():
    for run_seed in (0, 10**8, 2**40):  # a batch's seed is the run's times a million and more
        assert len(set(_batches(run_seed).__getitems__([5, 6]))) == 2
