"""data.decode=gpu's two halves, run here with the device half on the CPU (decode_jpeg decodes on
either; bench/gpu_check.sh times the real one on a GPU): loader worker processes hand over the
files' encoded bytes with the batch's draws, and the main process's decode and augmentation give
the same samples, labels, pixels and bad-sample count as data.decode=cpu, batch for batch."""

from __future__ import annotations

import shutil

import pytest
import torch
from torchvision.io import read_file
from torchvision.transforms import v2

from conftest import make_cfg
from turbotrain.data import build_data
from turbotrain.data.augment import build_op
from turbotrain.data.batched import batch_pipeline
from turbotrain.data.decode import RGBReader
from turbotrain.data.device_decode import DeviceDecode, EncodedBatch, EncodedTrain, PassEncoded
from turbotrain.data.loader import EpochSampler, build_loader, epoch_seed_cell
from turbotrain.data.safe import collate_skipping_bad
from turbotrain.data.vision import NormalizeCollate

CPU = torch.device("cpu")
SIZE = 32


@pytest.fixture(scope="module")
def tree(jpeg_tree, tmp_path_factory):
    root = tmp_path_factory.mktemp("decode") / "tree"
    shutil.copytree(jpeg_tree, root)
    (root / "train" / "china" / "007.jpg").write_bytes(b"not a jpeg")  # no image header: a bad sample
    return root


def _loaders(tree, workers: int, augment: list[dict]):
    """(decode=cpu's train loader, decode=gpu's halves on the CPU, the source) over one sampler and seed."""
    cfg = make_cfg("data=imagenet", f"data.root={tree}", f"data.image_size={SIZE}", f"loader.num_workers={workers}")
    cfg.data.augment = augment
    data = build_data(cfg.data)
    source = data.train.dataset.source
    ops = [v2.RandomResizedCrop(SIZE, antialias=True), *(build_op(a) for a in cfg.data.augment)]
    pipeline = batch_pipeline(ops)
    common = {"batch_size": 16, "loader_cfg": cfg.loader, "device": CPU, "train": True}
    seed = epoch_seed_cell().fill_(1234)
    cpu = build_loader(
        data.train, sampler=EpochSampler(len(source), 0), epoch_seed=seed, collate_fn=collate_skipping_bad, **common
    )
    gpu = build_loader(
        EncodedTrain(source, pipeline, RGBReader(cfg.data.max_image_pixels)),
        sampler=EpochSampler(len(source), 0),
        epoch_seed=seed,
        collate_fn=PassEncoded(collate_skipping_bad),
        on_device=lambda loader, device: DeviceDecode(loader, pipeline, NormalizeCollate(cfg.data.mean, cfg.data.std), device),
        **common,
    )
    return cpu, gpu, source


def test_workers_hand_over_the_files_bytes_and_the_device_half_equals_decode_cpu(tree):
    cpu, gpu, source = _loaders(tree, workers=2, augment=[{"name": "RandomHorizontalFlip", "p": 0.5}])
    encoded = list(gpu.loader)  # the workers' half, as it reaches the main process
    assert all(isinstance(b, EncodedBatch) for b in encoded) and len(encoded) == len(cpu) == 6
    by_name = {source.name(i): i for i in range(len(source))}
    for b in encoded[:2]:
        for name, data in zip(b.names, b.files, strict=True):
            assert torch.equal(data, read_file(name))  # the file's own bytes, not decoded pixels
            assert int(source.labels[by_name[name]]) in b.labels.tolist()
    bad = {"cpu": 0, "gpu": 0}
    for (x, y, dropped_cpu), (gx, gy, dropped_gpu) in zip(cpu, gpu, strict=True):
        # same crops and flips: a different one moves pixels by ~0.1; the normalizations' float
        # order differs by one rounding (~5e-7)
        torch.testing.assert_close(gx, x, rtol=0, atol=1e-5)
        assert torch.equal(gy, y)
        bad["cpu"] += int(dropped_cpu)
        bad["gpu"] += int(dropped_gpu)
    assert bad == {"cpu": 1, "gpu": 1}


def test_ops_that_draw_as_they_apply_do_not_depend_on_the_worker_count(tree):
    """ColorJitter draws in the main process, from a seed the batch brings: 0 or 2 workers, and
    a rerun, give the same pixels (what a resume relies on)."""
    augment = [{"name": "RandomHorizontalFlip", "p": 0.5}, {"name": "ColorJitter", "brightness": 0.4, "contrast": 0.4}]
    runs = [[x for x, _, _ in _loaders(tree, workers, augment)[1]] for workers in (0, 2)]
    torch.manual_seed(99)  # the main process's own stream must not matter
    runs.append([x for x, _, _ in _loaders(tree, 0, augment)[1]])
    for other in runs[1:]:
        for a, b in zip(runs[0], other, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
