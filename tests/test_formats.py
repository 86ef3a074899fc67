"""data=webdataset (tar shards) and data=hf_images (Hugging Face datasets) against the image folder
they were made from: the same samples, labels and bytes; damaged input; DDP; kill -9 and resume."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import pickle
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import datasets
import pytest
import torch
import webdataset as wds
from torchvision import datasets as tvd

from conftest import make_cfg, run_cli
from turbotrain.config import ConfigError
from turbotrain.data import build_data, tars
from turbotrain.data.decode import RGBReader
from turbotrain.data.listing import class_digest
from turbotrain.data.safe import DataError
from turbotrain.data.shards import convert
from turbotrain.data.tars import index_shard


@pytest.fixture()
def made(jpeg_formats):
    return jpeg_formats


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
    lines = {c: [f"{s['__key__']} {len(s['jpg'])}" for s in theirs if int(s["cls"]) == k] for k, c in enumerate(source.classes)}
    assert source.class_files == {c: class_digest(lines[c]) for c in source.classes}  # what a resume compares
    every = sorted(os.path.relpath(p, jpeg_tree / "train") for p, _ in reference.samples)
    assert sorted(json.loads(s["json"])["path"] for s in theirs) == every  # each file once


def test_a_source_sent_to_a_worker_opens_its_own_files(made, tmp_path):
    """A spawned worker gets the source pickled: the parent's open descriptors mean nothing there
    (the same numbers name other files), so the copy must open the shards itself. Emulated in
    this process: the parent's descriptors are closed and their numbers reused by another file."""
    source = _data("shards", made / "shards", tmp_path).train.dataset.source
    first = bytes(source.encoded(0).numpy())
    sent = pickle.dumps(source)
    for fd in source._open.values():
        os.close(fd)
    source._open.clear()
    other = [os.open(os.devnull, os.O_RDONLY) for _ in range(4)]  # takes the freed numbers
    try:
        assert bytes(pickle.loads(sent).encoded(0).numpy()) == first
    finally:
        for fd in other:
            os.close(fd)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts this process's descriptors in /proc")
def test_a_source_keeps_at_most_its_cap_of_shards_open_and_reads_every_member_whole(made, tmp_path, monkeypatch):
    monkeypatch.setattr(tars, "OPEN_FILES", 2)  # the cap (128) at the size of this fixture's shards
    shards = sorted(os.path.realpath(p) for p in (made / "shards").glob("train-*.tar"))
    source = _data("shards", made / "shards", tmp_path).train.dataset.source
    theirs = [s["jpg"] for s in wds.WebDataset(shards, shardshuffle=False, empty_check=False)]
    assert len(shards) > 2 and len(theirs) == len(source)

    def open_shards() -> int:
        fds = os.listdir("/proc/self/fd")
        return sum(os.path.realpath(f"/proc/self/fd/{fd}") in shards for fd in fds if os.path.exists(f"/proc/self/fd/{fd}"))

    before = open_shards()  # other tests' sources, left open
    for i in [*range(len(source)), *reversed(range(len(source)))]:  # every shard opened, closed, opened again
        assert bytes(source.encoded(i).numpy()) == theirs[i]
        assert open_shards() - before <= 2
    assert open_shards() - before == 2


def test_a_shard_cut_after_indexing_names_how_many_bytes_of_the_member_are_missing(made, tmp_path):
    """A shard truncated once its index is saved (a copy that died half-way, a full disk): the
    member read short is an error saying how far short, never a short image handed to the decoder."""
    shards = tmp_path / "shards"
    shutil.copytree(made / "shards", shards)
    source = _data("shards", shards, tmp_path / "cache").train.dataset.source
    i = len(source) - 1
    whole = bytes(source.encoded(i).numpy())
    last = Path(source.paths[int(source.shard[i])])
    last.write_bytes(last.read_bytes()[: int(source.offsets[i]) + 100])
    cut = pickle.loads(pickle.dumps(source))  # a fresh reader, as a worker has
    with pytest.raises(OSError) as e:
        cut.encoded(i)
    assert str(e.value) == f"the shard ends {len(whole) - 100} bytes into this member (truncated?)"
    assert bytes(cut.encoded(0).numpy()) == bytes(source.encoded(0).numpy())  # the others still read


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
    if fmt == "parquet":  # datasets' own cache of the converted files goes under data.cache_dir
        assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"] and any((tmp_path / "hf").iterdir())


def test_a_misconfigured_hf_dataset_is_refused_in_one_line_naming_the_key(made, tmp_path):
    disk, empty, one = made / "disk", tmp_path / "empty", tmp_path / "one"
    empty.mkdir()
    datasets.load_from_disk(str(disk))["train"].save_to_disk(str(one))
    splits = rf"no such split in data.root={disk} \(it has train, validation\)$"
    cases = {
        (f"data.root={empty}",): rf"^data.root={empty}: not a dataset in data.format=disk: ",
        (f"data.root={one}",): rf"^data.root={one}: one split saved, no validation: save a DatasetDict with both$",
        (f"data.root={disk}", "data.train_split=nope"): rf"^data.train_split=nope: {splits}",
        (f"data.root={disk}", "data.val_split=test"): rf"^data.val_split=test: {splits}",
        (f"data.root={disk}", "data.image_column=img"): r"^data.image_column=img: split train has columns image, label$",
        (f"data.root={disk}", "data.label_column=y"): r"^data.label_column=y: split train has columns image, label$",
    }
    for overrides, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            build_data(make_cfg("data=hf_images", *overrides).data)


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
    r = _train(shards, tmp_path / "d")  # skip: the cut sample is counted once, in summary.json
    summary = json.loads((tmp_path / "d" / "summary.json").read_text())
    assert r.returncode == 0 and (summary["bad_samples"], summary["bad_samples_indexed"]) == (1, 1), r.stderr[-2000:]
    r = _train(shards, tmp_path / "c", "data.train_shards='train-{000000..000010}.tar'")  # quoted: Hydra reads {} as a dict
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: data.train_shards=train-{{000000..000010}}.tar: missing shard {shards / 'train-000010.tar'}"
    ]


def _insert_malformed(shard, kind: str) -> None:
    """Rewrite `shard` with one malformed sample put in after its second sample (a real shard's
    members, copied as they were; the new ones as webdataset's writers name them)."""
    bad = {
        "no_label": {"bad.jpg": b"\xff\xd8\xff", "bad.json": b'{"x": 1}'},
        "wordnet_cls": {"bad.jpg": b"\xff\xd8\xff", "bad.cls": b"n01440764"},
        "no_image": {"bad.cls": b"1"},
    }[kind]
    with tarfile.open(shard) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    keys = list(dict.fromkeys(m.name.split(".", 1)[0] for m, _ in members))
    at = max(i for i, (m, _) in enumerate(members) if m.name.split(".", 1)[0] == keys[1]) + 1
    extra = []
    for name, data in bad.items():
        info = tarfile.TarInfo(name)
        info.size = len(data)
        extra.append((info, data))
    with tarfile.open(shard, "w") as tar:
        for info, data in members[:at] + extra + members[at:]:
            tar.addfile(info, io.BytesIO(data))


def test_a_malformed_sample_stops_indexing_under_on_bad_sample_error_naming_it(made, tmp_path):
    shards = tmp_path / "shards"
    shutil.copytree(made / "shards", shards)
    _insert_malformed(shards / "train-000004.tar", "wordnet_cls")
    cache = tmp_path / "cache"
    with pytest.raises(DataError, match=rf"^bad sample {re.escape(str(shards))}/train-000004.tar:bad: its .cls holds no integer"):
        _data("shards", shards, cache, "data.on_bad_sample=error")
    assert len(_data("shards", shards, cache).train.dataset.source) == 96  # skip: the 96 sound samples


@pytest.mark.parametrize(
    "url", ["s3://bucket/train-*.tar", "pipe:aws s3 cp s3://bucket/train-0.tar -", "https://host/train-0.tar"]
)
def test_shards_named_by_a_url_or_a_pipe_are_refused_naming_the_key(url, made, tmp_path):
    with pytest.raises(ConfigError) as refused:
        _data("shards", made / "shards", tmp_path, f"data.train_shards='{url}'")
    assert str(refused.value) == (  # the whole line: what to do instead is the point of it
        f"data.train_shards={url}: shards are read by random access, from a local or mounted filesystem, not a URL: "
        "mount the bucket (mountpoint-s3, gcsfuse) or copy the shards, and give their path"
    )


@pytest.mark.parametrize(
    ("pattern", "shards"),
    [
        ("train-{000000..000002}.tar", [0, 1, 2]),  # a brace range of names
        ("train-00000{3,1}*.tar", [3, 1]),  # globs within a brace list: each one's matches, in its order
        ("train-00000[0-1].tar", [0, 1]),
    ],
)
def test_a_shard_pattern_names_its_shards_in_its_order(pattern, shards, made, tmp_path):
    source = _data("shards", made / "shards", tmp_path, f"data.train_shards='{pattern}'").train.dataset.source
    assert source.paths == [str(made / "shards" / f"train-{n:06d}.tar") for n in shards]


@pytest.mark.parametrize(
    ("pattern", "error"),
    [
        ("train-{000009..000010}.tar", "missing shard {root}/train-000010.tar"),
        ("train-9*.tar", "no shard matches {root}/train-9*.tar"),
    ],
)
def test_a_shard_pattern_that_names_no_file_is_refused_naming_it(pattern, error, made, tmp_path):
    message = f"data.train_shards={pattern}: " + error.format(root=made / "shards")
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        _data("shards", made / "shards", tmp_path, f"data.train_shards='{pattern}'")


def test_the_shards_fingerprint_names_their_contents(made, tmp_path):
    """The fingerprint names a split's decoded cache: the same for the same shards (read again
    from the saved index), another for another split or once a shard is rewritten."""
    shards = tmp_path / "shards"
    shutil.copytree(made / "shards", shards)
    first = _data("shards", shards, tmp_path / "cache")
    again = _data("shards", shards, tmp_path / "cache").train.dataset.source.fingerprint
    _corrupt_member(shards / "train-000002.tar")
    changed = _data("shards", shards, tmp_path / "cache").train.dataset.source.fingerprint
    fingerprints = (first.train.dataset.source.fingerprint, again, changed, first.val.dataset.source.fingerprint)
    assert fingerprints[0] == fingerprints[1] and len(set(fingerprints)) == 3


def test_an_index_that_cannot_be_saved_is_named_and_the_run_goes_on(made, tmp_path, caplog):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "index").write_text("a file where the index folder goes")
    with caplog.at_level(logging.WARNING, logger="turbotrain"):
        data = _data("shards", made / "shards", tmp_path / "cache")
    assert len(data.train) == 96
    index = re.escape(str(tmp_path / "cache" / "index"))
    for n in (10, 4):  # the write's own error, whole: where, why, and that nothing was written
        why = rf"could not write {index}/(shards-[0-9a-f]+\.npz): File exists \(no \1 was written\)"
        assert (
            sum(bool(re.fullmatch(rf"data\.index: could not save the index of {n} shards: {why}", m)) for m in caplog.messages)
            == 1
        )


def test_shard_classes_come_from_classes_txt_or_else_are_the_label_numbers(made, tmp_path):
    shards = tmp_path / "shards"
    shutil.copytree(made / "shards", shards)
    assert _data("shards", shards, tmp_path / "c").class_names == ["china", "flower"]  # the converter's classes.txt
    (shards / "classes.txt").write_text("china\n")  # label 1 has no name
    message = f"data.root={shards}: label 1 in the shards, but {shards / 'classes.txt'} names 1 classes"
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        _data("shards", shards, tmp_path / "c")
    (shards / "classes.txt").unlink()
    assert _data("shards", shards, tmp_path / "c").class_names == ["0", "1"]
    for split in ("train", "val"):  # shards without a sample: no class, and no crash
        with tarfile.open(tmp_path / f"{split}-empty.tar", "w"):
            pass
    empty = _data("shards", tmp_path, tmp_path / "c", "data.train_shards=train-empty.tar", "data.val_shards=val-empty.tar")
    assert (empty.class_names, len(empty.train), len(empty.val)) == ([], 0, 0)


def test_three_malformed_samples_in_three_shards_cost_three_samples_counted_and_train_as_the_clean_set(made, tmp_path):
    """The issue's done criterion: left out at index time, the malformed samples change nothing
    else, so the run equals the clean shards' run weight for weight; summary.json counts 3."""
    shards = tmp_path / "shards"
    shutil.copytree(made / "shards", shards)
    for kind, n in (("no_label", 1), ("wordnet_cls", 4), ("no_image", 7)):
        _insert_malformed(shards / f"train-{n:06d}.tar", kind)
    clean, dirty = tmp_path / "clean", tmp_path / "dirty"
    for root, run in ((made / "shards", clean), (shards, dirty)):
        r = _train(root, run, "trainer.max_epochs=2")
        assert r.returncode == 0, r.stderr[-2000:]
    summaries = [json.loads((run / "summary.json").read_text()) for run in (clean, dirty)]
    assert [(s["bad_samples"], s["bad_samples_indexed"]) for s in summaries] == [(0, 0), (0, 3)]
    assert summaries[0]["best_val_acc1"] == summaries[1]["best_val_acc1"]
    weights = [torch.load(run / "checkpoints" / "last.pt")["model"] for run in (clean, dirty)]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


SITE = """
import os
from turbotrain.data import tars

real = tars.ShardSource.encoded


def traced(self, i):  # each training sample a process reads, by name
    if "/train-" in (name := self.name(i)):
        with open(os.path.join(os.environ["SAMPLE_TRACE"], str(os.getpid())), "a") as f:
            f.write(name + "\\n")
    return real(self, i)


tars.ShardSource.encoded = traced
"""


def test_two_process_ddp_over_shards_reads_every_training_sample_once_per_epoch(made, tmp_path):
    """Real torchrun-style ranks; the samples each reads are traced at the read (ShardSource.encoded)."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SITE)
    trace = tmp_path / "trace"
    trace.mkdir()
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "SAMPLE_TRACE": str(trace)}
    args = ("data=webdataset", f"data.root={made / 'shards'}", "data.image_size=16", "data.batch_size=8", "model=small_cnn")
    more = ("model.width=4", "trainer.max_epochs=1", "trainer.progress_bar=false", f"data.cache_dir={tmp_path / 'cache'}")
    r = run_cli("train.py", *args, *more, "distributed=ddp", "distributed.nproc=2", f"hydra.run.dir={tmp_path / 'run'}", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = [f.read_text().splitlines() for f in trace.iterdir()]
    source = _data("shards", made / "shards", tmp_path / "c").train.dataset.source
    assert sorted(len(names) for names in ranks) == [48, 48]  # 96 samples, 2 ranks x 6 steps x 8
    assert sorted(n for names in ranks for n in names) == sorted(source.name(i) for i in range(len(source)))


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """400 small training JPEGs in 4 classes (enough steps to kill a run mid-epoch), as a tree, shards, and a dataset."""
    import numpy as np
    from PIL import Image

    out = tmp_path_factory.mktemp("many")
    rng = np.random.default_rng(0)
    for split, n in (("train", 100), ("val", 8)):
        for c in range(4):
            d = out / "tree" / split / f"class{c}"
            d.mkdir(parents=True)
            for i in range(n):
                pixels = rng.integers(0, 256, (20, 20, 3), dtype=np.uint8) // 4 + np.uint8(60 * c)
                Image.fromarray(pixels).save(d / f"{i:03d}.jpg", quality=90)
    convert(out / "tree", out / "shards", per_shard=64)
    datasets.load_dataset("imagefolder", data_dir=str(out / "tree"), cache_dir=str(out / "hf")).save_to_disk(str(out / "disk"))
    return out


@pytest.mark.cpu_path
@pytest.mark.parametrize(("option", "folder"), [("imagenet", "tree"), ("webdataset", "shards"), ("hf_images", "disk")])
def test_kill_9_mid_epoch_and_resume_equals_the_uninterrupted_run(option, folder, many, tmp_path):
    from omegaconf import OmegaConf
    from test_resume import _events

    from conftest import ROOT
    from test_train import assert_same_run
    from turbotrain.core.checkpoint import load
    from turbotrain.train import numerics
    from turbotrain.train.run import train

    common = (
        f"data={option}",
        f"data.root={many / folder}",
        f"data.cache_dir={tmp_path / 'cache'}",
        "data.image_size=16",
        "data.batch_size=2",  # 200 steps: a clock checkpoint and the kill both fall inside the epoch
        "model=small_cnn",
        "model.width=4",
        "trainer.max_epochs=1",
        "trainer.log_every_n_steps=1",
        "trainer.progress_bar=false",
        "trainer.checkpoint_every_minutes=0.003",
    )
    full, cut = tmp_path / "full", tmp_path / "cut"
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *common, f"hydra.run.dir={cut}"], cwd=tmp_path)
    deadline = time.monotonic() + 120
    while not ((cut / "checkpoints" / "last.pt").is_file() and (cut / "metrics.jsonl").is_file() and len(_events(cut)) >= 10):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    proc.kill()
    proc.wait()
    saved = load(cut / "checkpoints" / "last.pt")["state"]
    assert saved["epoch"] == 0 and 0 < saved["global_step"] < 200  # a clock checkpoint, mid-epoch
    train(make_cfg(*common, "trainer.resume=auto"), cut)
    chosen = OmegaConf.create(load(cut / "checkpoints" / "last.pt")["config"])  # the killed run's own run-time choices
    train(make_cfg(*common, *(f"{key}={OmegaConf.select(chosen, key)}" for key in numerics.AUTO)), full)
    assert_same_run(full, cut)
