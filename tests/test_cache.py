"""Decoded caches of image folders (data.cache=raw|jpeg) and the batched RandomResizedCrop."""

from __future__ import annotations

import json
import logging
import shutil
import tracemalloc

import numpy as np
import pytest
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from conftest import make_cfg
from turbotrain.data import build_data, listing
from turbotrain.data import cache as cache_mod
from turbotrain.data.batched import batch_pipeline
from turbotrain.data.crops import padded_crops, resize_batched, resized_crops
from turbotrain.data.decode import RGBReader
from turbotrain.data.listing import FolderSource
from turbotrain.data.safe import DataError
from turbotrain.train.run import train


def _photos() -> list[torch.Tensor]:
    from sklearn.datasets import load_sample_images

    china, flower = (torch.from_numpy(im.copy()).permute(2, 0, 1).contiguous() for im in load_sample_images().images)
    return [china[:, :400, :600], flower[:, 20:427, :500], china[:, 50:300, 100:450]] * 8


def _boxes(images: list[torch.Tensor], size: int) -> torch.Tensor:
    rrc = v2.RandomResizedCrop(size)
    boxes = [rrc.make_params([image]) for image in images]
    return torch.tensor([[b["top"], b["left"], b["height"], b["width"]] for b in boxes])


@pytest.mark.parametrize("size", [64, 224])
def test_batched_resized_crops_equal_torchvision_per_sample(size):
    """The CPU path is torchvision's antialiased resized_crop itself; the batched (device) path
    applies the same filter weights in float, so it may round a pixel the other way."""
    images = _photos()
    torch.manual_seed(0)
    boxes = _boxes(images, size)
    pairs = zip(images, boxes.tolist(), strict=True)
    reference = torch.stack([TF.resized_crop(i, *b, [size, size], antialias=True) for i, b in pairs])
    assert torch.equal(resized_crops(images, boxes, (size, size)), reference)
    difference = (resize_batched(images, boxes, (size, size)).int() - reference.int()).abs()
    assert difference.max() <= 1 and difference.float().mean() < 0.25, (difference.max(), difference.float().mean())


def test_one_large_photo_does_not_pad_the_batch_to_its_size():
    """data.decode=gpu batches: the boxes are cut before padding, so the padded batch is as large as
    the largest crop, not the largest image; the result is unchanged (the per-sample filter)."""
    g = torch.Generator().manual_seed(0)
    images = [torch.randint(0, 256, (3, 60, 80), generator=g, dtype=torch.uint8) for _ in range(3)]
    images.append(torch.randint(0, 256, (3, 1500, 2000), generator=g, dtype=torch.uint8))  # a 3-megapixel photo
    boxes = torch.tensor([[5, 7, 40, 50], [0, 0, 60, 80], [10, 3, 33, 70], [700, 900, 48, 64]])
    assert padded_crops(images, boxes).shape == (4, 3, 60, 80)
    reference = torch.stack([TF.resized_crop(i, *b, [32, 32], antialias=True) for i, b in zip(images, boxes.tolist())])
    assert (resize_batched(images, boxes, (32, 32)).int() - reference.int()).abs().max() <= 1


@pytest.mark.parametrize("stored", ["chw", "hwc"])
def test_batched_crop_and_flips_draw_what_the_per_sample_path_draws(stored):
    """Images of different sizes and shapes: the crop boxes and flips come from the same draws in
    the same order, so the batch is the per-sample pipeline's, pixel for pixel, for decoded images
    (CHW) and for the raw cache's views of pixels stored HWC."""
    ops = [v2.RandomResizedCrop(56), v2.RandomHorizontalFlip(), v2.RandomVerticalFlip(0.3)]
    images = _photos()
    if stored == "hwc":
        images = [i.permute(1, 2, 0).contiguous().permute(2, 0, 1) for i in images]
    torch.manual_seed(4)
    batched = batch_pipeline(ops)(images)
    torch.manual_seed(4)
    per_sample = torch.stack([v2.Compose(ops)(tv_tensors.Image(i)).as_subclass(torch.Tensor) for i in images])
    assert torch.equal(batched, per_sample)


def _tree(jpeg_tree, tmp_path):
    root = tmp_path / "tree"
    shutil.copytree(jpeg_tree, root)
    return root


def _source(split) -> FolderSource:
    return FolderSource(listing.scan(split))


@pytest.mark.parametrize("kind", ["raw", "jpeg"])
def test_cache_is_built_once_and_rebuilt_when_the_tree_changes(kind, jpeg_tree, tmp_path, caplog):
    root = _tree(jpeg_tree, tmp_path)
    (root / "train" / "china" / "zz_bad.jpg").write_bytes(b"not a jpeg at all")
    samples = _source(root / "train")
    read = RGBReader(max_pixels=None)
    first = cache_mod.open_cache(tmp_path / "c", "t", samples, read, kind, 48)
    index = next((tmp_path / "c").iterdir()) / cache_mod.INDEX_FILE
    meta = json.loads(index.read_text())
    assert len(first) == len(samples) - 1 and len(meta["bad"]) == 1 and "zz_bad.jpg" in meta["bad"][0]
    good = [samples.name(i) for i in range(len(samples)) if "zz_bad" not in samples.name(i)]
    expected = TF.resize(read(good[5]).as_subclass(torch.Tensor), 48, antialias=True)
    got = first[5][0]
    assert got.shape == expected.shape and min(got.shape[-2:]) == 48
    if kind == "raw":
        assert torch.equal(got, expected)  # pixels stored as decoded
    else:
        assert (got.float() - expected.float()).abs().mean() < 6  # re-encoded at quality 90 (a 48 px photo crop)
    mtime = index.stat().st_mtime_ns
    cache_mod.open_cache(tmp_path / "c", "t", samples, read, kind, 48)
    assert index.stat().st_mtime_ns == mtime and len(list((tmp_path / "c").iterdir())) == 1  # reused
    shutil.copyfile(good[1], good[0])  # a changed file: a new cache; the old one is kept and named
    with caplog.at_level(logging.WARNING, logger="turbotrain"):
        cache_mod.open_cache(tmp_path / "c", "t", _source(root / "train"), read, kind, 48)
    assert len(list((tmp_path / "c").iterdir())) == 2
    assert str(index.parent) in caplog.text and "1 earlier one(s)" in caplog.text


def test_files_the_cache_leaves_out_are_counted_once_and_error_stops_naming_them(jpeg_tree, tmp_path):
    """A file that fails to decode in the build never reaches a training batch, so bad_samples
    cannot see it: the bundle's bad_samples_indexed must (on main it said 0)."""
    root = _tree(jpeg_tree, tmp_path)
    (root / "train" / "china" / "zz_bad.jpg").write_bytes(b"not a jpeg at all")
    (root / "val" / "flower" / "zz_bad.jpg").write_bytes(b"\xff\xd8 cut short")
    common = ("data=imagenet", f"data.root={root}", "data.image_size=32", f"data.cache_dir={tmp_path}", "data.cache=raw")
    data = build_data(make_cfg(*common).data)
    assert data.bad_indexed == 2
    assert len(data.train) == 96 and len(data.val) == 32  # the fixture's 48 + 16 per class, less nothing else
    with pytest.raises(DataError, match=r"zz_bad\.jpg.*data\.on_bad_sample=skip"):
        build_data(make_cfg(*common, "data.on_bad_sample=error").data)


def test_an_imagenet_sized_index_opens_without_an_object_per_image(tmp_path):
    """1.28M records through the index writer: opening allocates the labels' one array and no
    Python object per image (the JSON lists it replaced took ~200 bytes and 20 s per image set)."""
    n = 1_281_167
    records = np.zeros(n, cache_mod.RECORD)
    records["size"], records["shape"], records["label"] = 12, (3, 2, 2), np.arange(n) % 1000
    records["offset"] = np.arange(n) * 12
    cache_mod.save_index(tmp_path, records, "raw", 2, bad=[], seconds=0.0)
    with open(tmp_path / cache_mod.DATA_FILE, "wb") as f:
        f.truncate(12 * n)  # sparse: the pixels are never read here
    tracemalloc.start()
    cache = cache_mod.CachedImages(tmp_path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 9 * n + 2**20  # int64 labels, once
    assert len(cache) == n and int(cache.labels[-1]) == (n - 1) % 1000 and cache[n - 1][0].shape == (3, 2, 2)


def test_building_a_cache_leaves_the_global_rng_alone(jpeg_tree, tmp_path):
    """A run that builds its cache must train as one that reuses it: same weights, same draws."""
    samples = _source(jpeg_tree / "train")
    torch.manual_seed(0)
    cache_mod.open_cache(tmp_path / "c", "t", samples, RGBReader(max_pixels=None), "raw", 48)
    after_build = torch.rand(4)
    torch.manual_seed(0)
    assert torch.equal(after_build, torch.rand(4))


def test_a_failed_build_leaves_no_cache(jpeg_tree, tmp_path, monkeypatch):
    samples = _source(jpeg_tree / "train")
    real = cache_mod._Decode.__getitem__

    def dies_at_the_tenth(self, i):
        if i == 10:
            raise OSError(28, "No space left on device")  # the decode worker fails mid-build
        return real(self, i)

    monkeypatch.setattr(cache_mod._Decode, "__getitem__", dies_at_the_tenth)
    with pytest.raises(Exception, match="No space left"):
        cache_mod.open_cache(tmp_path / "c", "t", samples, RGBReader(None), "raw", 32)
    assert list((tmp_path / "c").iterdir()) == []  # no half cache, no temp folder


def test_training_split_keeps_room_for_crops_and_nothing_is_enlarged(jpeg_tree, tmp_path):
    """At the eval resize, RandomResizedCrop's small crops would be enlarged from a thumbnail
    (measured: -7 points of top-1 on the bench's JPEG tree); the training split is kept at
    2 x image_size, the validation split at the eval resize, and no image is ever enlarged."""
    from torchvision.io import encode_jpeg

    root = _tree(jpeg_tree, tmp_path)
    small = torch.randint(0, 256, (3, 40, 50), dtype=torch.uint8)
    (root / "train" / "china" / "zz_small.jpg").write_bytes(encode_jpeg(small).numpy().tobytes())
    cfg = make_cfg("data=imagenet", f"data.root={root}", "data.image_size=48", f"data.cache_dir={tmp_path}", "data.cache=raw")
    data = build_data(cfg.data)
    train_sides = sorted(min(shape[-2:]) for shape in data.train.cache.shapes)
    assert train_sides[0] == 40 and set(train_sides[1:]) == {96}  # the small image as it was; 2 x 48 px
    assert {min(shape[-2:]) for shape in data.val.cache.shapes} == {55}  # round(48 / 0.875)


def test_cached_eval_images_equal_the_uncached_ones(jpeg_tree, tmp_path):
    common = ("data=imagenet", f"data.root={jpeg_tree}", "data.image_size=48", f"data.cache_dir={tmp_path}")
    plain = build_data(make_cfg(*common).data)
    cached = build_data(make_cfg(*common, "data.cache=raw").data)
    x_plain, y_plain = plain.collate([plain.val[i] for i in range(8)])[:2]
    x_cached, y_cached = cached.collate(cached.val.__getitems__(list(range(8))))
    assert torch.equal(y_plain, y_cached)
    torch.testing.assert_close(x_cached, x_plain, atol=1e-5, rtol=0)  # same resize, same center crop
    train_batch = cached.collate(cached.train.__getitems__(list(range(8))))[0]
    assert x_cached.is_contiguous() and train_batch.is_contiguous()  # stored HWC, given to the model NCHW


@pytest.mark.slow  # ~15 s a kind; the cache itself is tested above, in-process
@pytest.mark.parametrize("kind", ["raw", "jpeg"])
def test_cached_run_learns_like_the_uncached_one_and_resumes(kind, jpeg_tree, tmp_path):
    common = (
        "data=imagenet",
        f"data.root={jpeg_tree}",
        "data.image_size=64",
        "data.batch_size=16",
        f"data.cache={kind}",
        f"data.cache_dir={tmp_path / 'cache'}",
        "model=small_cnn",
        "trainer.progress_bar=false",
        "sched.warmup_steps=5",
        "optim.lr=0.05",
    )
    assert train(make_cfg(*common, "trainer.max_epochs=6"), tmp_path / "run") >= 0.75  # as test_train's uncached run
    train(make_cfg(*common, "trainer.max_epochs=7", "trainer.resume=auto"), tmp_path / "run")
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["epochs"] == 7


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_gpu_decode_without_cuda_fails_at_start_in_one_line(jpeg_tree, tmp_path):
    from conftest import run_cli

    r = run_cli("train.py", "data=imagenet", f"data.root={jpeg_tree}", "data.decode=gpu", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "error: data.decode=gpu needs CUDA (nvJPEG) and this machine has none: use data.decode=cpu"
    ]
