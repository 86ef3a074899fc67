"""data.loader.EpochSampler against what it yields: its length is the count of indices each rank
iterates (DataLoader's len, the steps of an epoch), and a new epoch covers every sample (the
bucketing and the epoch-order tests are in test_text.py and test_alternating.py)."""

import pytest

from turbotrain.data.loader import EpochSampler


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("pad", [True, False])
def test_each_ranks_length_is_what_it_yields_from_any_start(pad, shuffle):
    for n, world_size in ((10, 1), (10, 3), (11, 4), (3, 4)):
        for rank in range(world_size):
            sampler = EpochSampler(n, seed=2, shuffle=shuffle, rank=rank, world_size=world_size, pad=pad)
            sampler.set_epoch(1, start=0)
            for start in range(len(list(sampler)) + 1):  # a resume starts within the rank's share
                sampler.set_epoch(1, start=start)
                assert len(sampler) == len(list(sampler)), (n, world_size, rank, start)


def test_ranks_share_a_padded_epoch_equally_and_an_unpadded_one_exactly():
    padded = [list(EpochSampler(11, seed=2, rank=r, world_size=4)) for r in range(4)]
    assert [len(p) for p in padded] == [3, 3, 3, 3]  # one more step's worth than 11 / 4, repeated samples
    assert sorted(set(sum(padded, []))) == list(range(11))
    exact = [list(EpochSampler(11, seed=2, shuffle=False, rank=r, world_size=4, pad=False)) for r in range(4)]
    assert sorted(sum(exact, [])) == list(range(11))  # validation: each sample once


def test_a_new_epoch_yields_every_sample_once():
    sampler = EpochSampler(10, seed=2)
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        assert sorted(sampler) == list(range(10))
