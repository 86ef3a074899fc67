"""data=webdataset (tar shards) and data=hf_images (Hugging Face datasets) against the image folder
they were made from: the same samples, labels and bytes; damaged input; DDP; kill -9 and resume."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import datasets
import pytest
import torch
import webdataset as wds
from torchvision import datasets as tvd

from conftest import make_cfg, run_cli
from turbotrain.data import build_data
from turbotrain.data.decode import RGBReader
from turbotrain.data.shards import convert
from turbotrain.data.tars import index_shard


@pytest.fixture(scope="module")
def made(jpeg_tree, tmp_path_factory):
    """The jpeg tree as shards (10 samples each), as a save_to_disk folder and as Parquet files."""
    out = tmp_path_factory.mktemp("formats")
    convert(jpeg_tree, out / "shards", per_shard=10)
    loaded = datasets.load_dataset("imagefolder", data_dir=str(jpeg_tree), cache_dir=str(out / "hf_cache"))
    loaded.save_to_disk(str(out / "disk"))
    for split, ds in loaded.items():
        ds.to_parquet(str(out / "parquet" / f"{split}-00000-of-00001.parquet"))
    return out


def _data(fmt: str, root, cache_dir, *extra):
    option = {"shards": "data=webdataset", "disk": "data=hf_images", "parquet": "data=hf_images"}[fmt]
    args = (option, f"data.root={root}", "data.image_size=32", f"data.cache_dir={cache_dir}", *extra)
    return build_data(make_cfg(*args, *(("data.format=parquet",) if fmt == "parquet" else ())).data)


def test_shards_round_trip_the_tree_and_read_back_in_webdatasets_own_reader(jpeg_tree, made, tmp_path):
    reference = tvd.ImageFolder(str(jpeg_tree / "train"))
    label_of = {p: t for p, t in reference.samples}
    source = _data("shards", made / "shards", tmp_path).train.dataset.source
    assert len(source) == len(reference) and source.classes == reference.classes
    theirs = list(wds.WebDataset(sorted(map(str, (made / "shards").glob("train-*.tar"))), shardshuffle=False, empty_check=False))
    read = RGBReader(None)
    for i, sample in enumerate(theirs):
        path = str(jpeg_tree / "train" / json.loads(sample["json"])["path"])
        assert int(sample["cls"]) == int(source.labels[i]) == label_of[path]
        assert bytes(source.encoded(i).numpy()) == sample["jpg"] == Path(path).read_bytes()
        if i % 16 == 0:
            assert torch.equal(read(source.encoded(i)), read(path))  # the pixels, decoded
    every = sorted(os.path.relpath(p, jpeg_tree / "train") for p, _ in reference.samples)
    assert sorted(json.loads(s["json"])["path"] for s in theirs) == every  # each file once


def _sha(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


@pytest.mark.parametrize("fmt", ["disk", "parquet"])
def test_hf_images_hold_the_trees_images_and_class_labels(fmt, jpeg_tree, made, tmp_path):
    for split, key in (("train", "train"), ("val", "val")):
        reference = tvd.ImageFolder(str(jpeg_tree / split))
        data = _data(fmt, made / fmt, tmp_path)
        source = (data.train if key == "train" else data.val).dataset.source
        assert data.class_names == reference.classes
        expected = sorted((_sha(Path(p).read_bytes()), t) for p, t in reference.samples)
        got = sorted((_sha(bytes(source.encoded(i).numpy())), int(source.labels[i])) for i in range(len(source)))
        assert got == expected


def _corrupt_member(shard, n: int = 1):
    """Overwrite the n-th image member's bytes in place: a bad sample inside a sound tar."""
    keys, offsets, sizes, _, _ = index_shard(shard, "error")
    with open(shard, "r+b") as f:
        f.seek(offsets[n])
        f.write(b"\x00" * sizes[n])
    return f"{shard}:{keys[n]}"


def _train(fmt_root, run, *extra):
    args = ("data=webdataset", f"data.root={fmt_root}", "data.image_size=16", "data.batch_size=16", "model=small_cnn")
    more = ("model.width=4", "trainer.max_epochs=1", "trainer.progress_bar=false", f"data.cache_dir={run.parent / 'cache'}")
    return run_cli("train.py", *args, *more, *extra, f"hydra.run.dir={run}")


def test_a_corrupt_member_is_skipped_and_counted_and_a_damaged_or_missing_shard_named(made, tmp_path):
    shards = tmp_path / "shards"
    shutil.copytree(made / "shards", shards)
    bad = _corrupt_member(shards / "train-000003.tar")
    r = _train(shards, tmp_path / "a")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["bad_samples"] == 1
    assert bad in (tmp_path / "a" / "train.log").read_text()
    last = shards / "train-000009.tar"
    third = index_shard(last, "error")[1][2]
    last.write_bytes(last.read_bytes()[: third + 100])  # cut inside its third image
    r = _train(shards, tmp_path / "b", "data.on_bad_sample=error")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert f"shard {last} is damaged after 2 samples" in r.stderr
    r = _train(shards, tmp_path / "c", "data.train_shards='train-{000000..000010}.tar'")  # quoted: Hydra reads {} as a dict
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: data.train_shards=train-{{000000..000010}}.tar: missing shard {shards / 'train-000010.tar'}"
    ]
