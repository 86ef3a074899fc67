"""Every reader keeps each image with its own label: a malformed sample is left out alone, named
and counted, and never shifts a later label onto another image. Shard sets are generated with
webdataset's own TarWriter from a seed, malformed samples mixed in; each indexed image is found by
its bytes and its label compared with the one written for it."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import random
import re
import tarfile

import pytest
import torch
from torchvision.io import encode_jpeg
from webdataset import TarWriter

from conftest import make_cfg
from turbotrain.data import build_data
from turbotrain.data.safe import DataError
from turbotrain.data.tars import BadSample, _label, index_shard

# what a sample can be: (kind, left out?); keys with dots or slashes, upper-case extensions and
# .json labels are well-formed (WebDataset's grouping: the key ends at the name's first dot)
KINDS = {
    "jpg": False,
    "JPG": False,
    "json": False,
    "slash_key": False,
    "json_no_label": True,
    "cls_wordnet_id": True,
    "cls_float": True,
    "no_image": True,
    "unknown_ext": True,
    "empty_image": True,
    "dot_in_key": True,  # webdataset reads "k.v2.jpg" as key k, field "v2.jpg": no image field
}


def _jpeg(rng: random.Random) -> bytes:
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    return encode_jpeg(torch.randint(0, 256, (3, 8, 8), generator=g, dtype=torch.uint8), quality=90).numpy().tobytes()


def _sample(kind: str, key: str, label: int, image: bytes) -> dict:
    cls = str(label).encode()
    return {
        "jpg": {"__key__": key, "jpg": image, "cls": cls},
        "JPG": {"__key__": key, "JPG": image, "cls": cls},
        "json": {"__key__": key, "jpg": image, "json": json.dumps({"label": label, "who": "x"}).encode()},
        "slash_key": {"__key__": f"part/{key}", "jpg": image, "cls": cls},
        "json_no_label": {"__key__": key, "jpg": image, "json": b'{"caption": "a dog"}'},
        "cls_wordnet_id": {"__key__": key, "jpg": image, "cls": b"n01440764"},
        "cls_float": {"__key__": key, "jpg": image, "cls": b"3.5"},
        "no_image": {"__key__": key, "cls": cls},
        "unknown_ext": {"__key__": key, "tiff2": image, "cls": cls},
        "empty_image": {"__key__": key, "jpg": b"", "cls": cls},
        "dot_in_key": {"__key__": f"{key}.v2", "jpg": image, "cls": cls},
    }[kind]


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("json_no_label", "its .json holds no integer label (KeyError: 'cls')"),
        ("cls_float", "its .cls holds no integer label (ValueError: invalid literal for int() with base 10: '3.5')"),
        ("no_image", "no image member (.jpg, .jpeg, .png, .webp); it has .cls"),
        ("unknown_ext", "no image member (.jpg, .jpeg, .png, .webp); it has .cls, .tiff2"),
        ("empty_image", "its image member is empty"),
        ("dot_in_key", "no image member (.jpg, .jpeg, .png, .webp); it has .v2.cls, .v2.jpg"),
    ],
)
def test_each_malformed_sample_is_named_with_what_is_wrong(kind, why, tmp_path, caplog):
    path = tmp_path / "train-000000.tar"
    with TarWriter(str(path), encoder=False) as sink:
        sink.write(_sample(kind, "k0", 1, _jpeg(random.Random(0))))
    with pytest.raises(DataError, match=f"^{re.escape(f'bad sample {path}:k0: {why} (data.on_bad_sample=skip leaves it out)')}$"):
        index_shard(path, "error")
    with caplog.at_level(logging.WARNING, logger="turbotrain"):
        assert index_shard(path, "skip") == ([], [], [], [], 1)
    assert caplog.messages == [f"bad sample {path}:k0: {why} (skipped)"]


def test_a_sample_without_a_label_member_is_named(tmp_path):
    path = tmp_path / "train-000000.tar"
    with tarfile.open(path, "w") as tar:
        _member(tar, "k0.jpg", b"\xff\xd8" + bytes(100))
        _member(tar, "k0.txt", b"a caption")
    with pytest.raises(DataError, match=re.escape(f"bad sample {path}:k0: no label member (.cls, .json); it has .jpg, .txt (")):
        index_shard(path, "error")


def _write_shards(root, seed: int, split: str, shards: int, bad_rate: float) -> tuple[dict[str, int], int]:
    """Shards of random samples: (image sha -> the label written with it, for well-formed
    samples; how many were malformed). The last shard of a training set is cut inside a member."""
    rng = random.Random(seed)
    good, broken = {}, 0
    for s in range(shards):
        path = root / f"{split}-{s:06d}.tar"
        written = []
        with TarWriter(str(path), encoder=False) as sink:
            for i in range(rng.randint(4, 14)):
                kind = rng.choice([k for k, bad in KINDS.items() if bad]) if rng.random() < bad_rate else "jpg"
                kind = rng.choice(["jpg", "JPG", "json", "slash_key"]) if kind == "jpg" else kind
                label, image = rng.randrange(10), _jpeg(rng)
                sink.write(_sample(kind, f"s{s}_{i:03d}", label, image))
                written.append((kind, label, image))
        if split == "train" and s == shards - 1:  # cut inside the data of a member of the k-th sample
            data = path.read_bytes()
            k = rng.randrange(len(written))
            lost = [w for w in written[k:] if w[2] and w[2] in data]
            cut = data.index(lost[0][2]) + 3 if lost else len(data)
            path.write_bytes(data[:cut])
            broken += 1 if lost else 0  # the sample the cut fell in; what follows it is invisible
            written = written[: written.index(lost[0])] if lost else written
        for kind, label, image in written:
            if KINDS[kind]:
                broken += 1
            else:
                good[hashlib.sha256(image).hexdigest()] = label
    return good, broken


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_each_indexed_image_keeps_its_own_label_and_every_malformed_sample_is_counted(tmp_path, seed):
    root = tmp_path / "shards"
    root.mkdir()
    good, broken = _write_shards(root, seed, "train", shards=3, bad_rate=0.35)
    val_good, val_broken = _write_shards(root, seed + 100, "val", shards=1, bad_rate=0.35)
    cfg = make_cfg("data=webdataset", f"data.root={root}", f"data.cache_dir={tmp_path / 'cache'}", "data.image_size=8")
    data = build_data(cfg.data)
    for dataset, written in ((data.train, good), (data.val, val_good)):
        source = dataset.dataset.source
        got = {hashlib.sha256(bytes(source.encoded(i).numpy())).hexdigest(): int(source.labels[i]) for i in range(len(source))}
        assert got == written  # every well-formed sample, each with the label written for its image
    assert data.bad_indexed == broken + val_broken


def test_a_malformed_label_stops_the_run_naming_the_shard_and_key_under_on_bad_sample_error(tmp_path):
    path = tmp_path / "train-000000.tar"
    rng = random.Random(0)
    with TarWriter(str(path), encoder=False) as sink:
        for i, kind in enumerate(["jpg", "cls_wordnet_id", "jpg"]):
            sink.write(_sample(kind, f"k{i}", 1, _jpeg(rng)))
    with pytest.raises(DataError, match=rf"^bad sample {path}:k1: its \.cls holds no integer label .*on_bad_sample=skip"):
        index_shard(path, "error")
    keys, _, _, labels, skipped = index_shard(path, "skip")
    assert (keys, labels, skipped) == (["k0", "k2"], [1, 1], 1)  # the rest of the shard stays


def _member(tar: tarfile.TarFile, name: str, data: bytes | None = None) -> None:
    info = tarfile.TarInfo(name)
    if data is None:
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    else:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def test_a_tar_from_any_writer_groups_its_samples_and_a_cut_one_is_lost_alone(tmp_path, caplog):
    """Folder entries and files without an extension (a tar of a folder by GNU tar) are passed
    over, not the end of the shard; samples of one name in two folders are two samples. A shard
    cut anywhere inside its last sample (its data, or right at its data's end, no padding) keeps
    the samples before it and counts one lost."""
    path = tmp_path / "train-000000.tar"
    with tarfile.open(path, "w") as tar:
        _member(tar, "a")
        _member(tar, "README", b"photos")
        for key, label in (("a/000", b"0"), ("b/000", b"1")):
            _member(tar, f"{key}.jpg", b"\xff\xd8" + bytes(700))
            _member(tar, f"{key}.cls", label)
        _member(tar, "c/001.cls", b"1")
        _member(tar, "c/001.jpg", b"\xff\xd8" + bytes(700))
    with tarfile.open(path) as tar:
        last = tar.getmembers()[-1]  # where its data lies (a writer's TarInfo does not say)
    keys, offsets, sizes, labels, skipped = index_shard(path, "skip")
    assert (keys, sizes, labels, skipped) == (["a/000", "b/000", "c/001"], [702] * 3, [0, 1, 1], 0)
    whole = path.read_bytes()
    assert whole[offsets[2] : offsets[2] + 2] == b"\xff\xd8"  # each offset is its image's
    damaged = f"shard {path} is damaged after 2 samples: ReadError: unexpected end of data"
    for cut in (last.offset_data + 100, last.offset_data + last.size):
        path.write_bytes(whole[:cut])
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="turbotrain"):
            assert index_shard(path, "skip") == (["a/000", "b/000"], offsets[:2], [702] * 2, [0, 1], 1)
        lost = "counted as one lost sample: how many followed it cannot be known"
        assert caplog.messages == [f"{damaged} ({lost})"]
        with pytest.raises(
            DataError, match=f"^{re.escape(damaged)} \\(data.on_bad_sample=skip keeps the samples before the damage\\)$"
        ):
            index_shard(path, "error")


def _samples_k0_to(path, n: int) -> list[tarfile.TarInfo]:
    """A plain shard of samples k0..k<n-1> (.jpg, .cls label 1); its members as read back, with
    where each one's header and data lie (a writer's TarInfo does not say)."""
    with tarfile.open(path, "w") as tar:
        for k in range(n):
            _member(tar, f"k{k}.jpg", b"\xff\xd8" + bytes(600))
            _member(tar, f"k{k}.cls", b"1")
    with tarfile.open(path) as tar:
        return tar.getmembers()


@pytest.mark.parametrize("into", [1, 100, 511])
def test_a_shard_cut_inside_a_header_keeps_the_samples_before_it_and_says_so(into, tmp_path, caplog):
    """tarfile ends quietly at a header cut short, as at the end of the archive: the index says so."""
    path = tmp_path / "train-000000.tar"
    third = _samples_k0_to(path, 3)[4].offset  # the third sample's first header
    path.write_bytes(path.read_bytes()[: third + into])
    message = f"shard {path} ends inside a member's header after 2 samples (truncated)"
    with pytest.raises(DataError, match=f"^{re.escape(message)} \\(data.on_bad_sample=skip keeps the samples before it\\)$"):
        index_shard(path, "error")
    with caplog.at_level(logging.WARNING, logger="turbotrain"):
        keys, _, _, labels, skipped = index_shard(path, "skip")
    assert (keys, labels, skipped) == (["k0", "k1"], [1, 1], 0)  # how many followed cannot be known
    assert caplog.messages == [f"{message} (any later samples are lost)"]


@pytest.mark.parametrize("zero_blocks", [0, 1])
def test_a_shard_ending_at_a_header_boundary_or_one_zero_block_is_whole(zero_blocks, tmp_path, caplog):
    """Writers that end a tar after its last member, or after one zero block instead of two,
    leave no sample cut: nothing is lost or said."""
    path = tmp_path / "train-000000.tar"
    last = _samples_k0_to(path, 2)[-1]
    end = last.offset_data + -(-last.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
    path.write_bytes(path.read_bytes()[: end + zero_blocks * tarfile.BLOCKSIZE])
    with caplog.at_level(logging.WARNING, logger="turbotrain"):
        keys, _, _, labels, skipped = index_shard(path, "error")
    assert (keys, labels, skipped, caplog.messages) == (["k0", "k1"], [1, 1], 0, [])


@pytest.mark.parametrize(
    ("ext", "member", "expected"),
    [
        ("cls", b" 7\n", 7),
        ("json", b'{"label": 2, "cls": 9}', 2),  # "label" first
        ("json", b'{"cls": 4}', 4),
        ("json", b'{"label": "5"}', 5),
        ("json", b'{"caption": "a dog"}', "its .json holds no integer label (KeyError: 'cls')"),
        ("json", b'{"label": true}', "its .json label True is not a non-negative integer"),
        ("json", b'{"label": "-1"}', "its .json label '-1' is not a non-negative integer"),
        ("json", b'{"label": 1.5}', "its .json label 1.5 is not a non-negative integer"),
        (
            "cls",
            b"n01440764",
            "its .cls holds no integer label (ValueError: invalid literal for int() with base 10: 'n01440764')",
        ),
    ],
)
def test_a_label_member_gives_its_integer_or_says_why_not(ext, member, expected):
    if isinstance(expected, int):
        assert _label(member, ext) == expected
    else:
        with pytest.raises(BadSample, match=f"^{re.escape(expected)}$"):
            _label(member, ext)


@pytest.mark.parametrize("label_type", ["ClassLabel", "int32"])  # int32: plain integers, as many Parquet files hold them
def test_hf_images_leave_out_rows_without_a_label_and_keep_every_other_row_with_its_own(tmp_path, label_type, caplog):
    """Null labels (and ClassLabel's -1) are left out at listing and counted; a row without an
    image keeps its place and is a bad sample when read (counted in bad_samples). The loss takes
    the targets of either label type."""
    import datasets

    rng = random.Random(5)
    label = datasets.ClassLabel(names=[f"c{k}" for k in range(4)]) if label_type == "ClassLabel" else datasets.Value("int32")
    features = datasets.Features({"image": datasets.Image(), "label": label})
    splits, expected = {}, {}
    for split, n in (("train", 30), ("validation", 8)):
        rows = {"image": [], "label": []}
        for _ in range(n):
            image, label = _jpeg(rng), rng.randrange(4)
            roll = rng.random()
            label = None if roll < 0.15 else -1 if roll < 0.25 else label
            rows["image"].append(None if 0.25 <= roll < 0.35 else {"bytes": image, "path": None})
            rows["label"].append(label)
            expected.setdefault(split, []).append((image if rows["image"][-1] else None, label))
        splits[split] = datasets.Dataset.from_dict(rows, features=features)
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "disk"))
    with caplog.at_level(logging.WARNING, logger="turbotrain"):
        data = build_data(make_cfg("data=hf_images", f"data.root={tmp_path / 'disk'}", "data.image_size=8").data)
    for split, rows in expected.items():  # each split's warning names its first five rows left out
        left_out = [r for r, (_, label) in enumerate(rows) if label is None or label < 0]
        first = ", ".join(map(str, left_out[:5]))
        assert f"split {split}: {len(left_out)} row(s) without a label left out (rows {first}...)" in caplog.messages
        assert split != "train" or len(left_out) > 5  # more than the five it names
    for dataset, split in ((data.train, "train"), (data.val, "validation")):
        source = dataset.dataset.source
        labelled = [(image, label) for image, label in expected[split] if label is not None and label >= 0]
        assert len(source) == len(labelled)
        for i, (image, label) in enumerate(labelled):
            assert int(source.labels[i]) == label
            if image is None:
                with pytest.raises(ValueError, match=r"^the row has no image \(neither bytes nor a path\)$"):
                    source.encoded(i)
            else:
                assert bytes(source.encoded(i).numpy()) == image
    unlabelled = sum(label is None or label < 0 for rows in expected.values() for _, label in rows)
    assert data.bad_indexed == unlabelled > 0
    assert data.class_names == [f"c{k}" if label_type == "ClassLabel" else str(k) for k in range(4)]
    targets = torch.as_tensor(data.val.dataset.source.labels)
    loss = torch.nn.functional.cross_entropy(torch.zeros(len(targets), 4), targets)
    assert loss.item() == pytest.approx(math.log(4))


@pytest.mark.filterwarnings("error:invalid value encountered in cast:RuntimeWarning")  # nulls read as NaN
def test_a_split_without_a_labelled_row_adds_no_class_and_is_refused_as_empty(tmp_path):
    """An unlabelled split (a hub dataset's test split: every label null or -1) is left out row by
    row: it adds no class to the training split's, and a run validating on it is refused in one line."""
    import datasets

    from turbotrain.config import ConfigError
    from turbotrain.train.run import train

    rng = random.Random(3)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int32")})
    splits = {"train": [0, 0, 0, 0], "validation": [None, -1, None]}
    rows = {k: {"image": [{"bytes": _jpeg(rng), "path": None} for _ in v], "label": v} for k, v in splits.items()}
    datasets.DatasetDict({k: datasets.Dataset.from_dict(r, features=features) for k, r in rows.items()}).save_to_disk(
        str(tmp_path / "disk")
    )
    cfg = make_cfg("data=hf_images", f"data.root={tmp_path / 'disk'}", "data.image_size=8", "trainer.max_epochs=1")
    data = build_data(cfg.data)
    assert (data.class_names, len(data.train), len(data.val), data.bad_indexed) == (["0"], 4, 0, 3)
    with pytest.raises(
        ConfigError, match=r"^data=hf_images: the validation split is empty \(data.val_split=validation\): give it samples$"
    ):
        train(cfg, tmp_path / "run")


def test_the_image_folder_listing_labels_each_file_by_its_class_folder_and_counts_broken_links(tmp_path):
    """Upper-case extensions and nested folders are samples of their class; other files are not
    samples; a broken symlink is left out and counted; an empty .jpg stays (a bad sample when read)."""
    rng = random.Random(7)
    root, expected, broken = tmp_path / "tree", {}, 0
    classes = ["ant", "bee", "cat"]
    for split in ("train", "val"):
        for label, cls in enumerate(classes):
            for i in range(rng.randint(3, 8)):
                kind = rng.choice(["jpg", "JPG", "nested", "txt", "empty", "broken_link"])
                folder = root / split / cls / ("sub/deeper" if kind == "nested" else "")
                folder.mkdir(parents=True, exist_ok=True)
                name = f"{i:03d}.{'JPG' if kind == 'JPG' else 'txt' if kind == 'txt' else 'jpg'}"
                if kind == "broken_link":
                    (folder / name).symlink_to(tmp_path / "gone" / name)
                    broken += 1
                    continue
                image = b"" if kind == "empty" else _jpeg(rng)
                (folder / name).write_bytes(image)
                if kind != "txt":
                    expected[str(folder / name)] = label
        for label, cls in enumerate(classes):  # every class keeps an image
            (root / split / cls / "keep.jpg").write_bytes(_jpeg(rng))
            expected[str(root / split / cls / "keep.jpg")] = label
    data = build_data(make_cfg("data=imagenet", f"data.root={root}", f"data.cache_dir={tmp_path / 'cache'}").data)
    got = {}
    for dataset in (data.train, data.val):
        source = dataset.dataset.source
        got |= {source.name(i): int(source.labels[i]) for i in range(len(source))}
    assert got == expected and data.class_names == classes
    assert data.bad_indexed == broken


def test_text_rows_without_text_or_a_known_label_are_left_out_counted_and_the_rest_keep_theirs():
    import datasets

    from turbotrain.data.text import _labelled

    rng = random.Random(3)
    splits, kept, left_out = {}, {}, 0
    for split in ("train", "validation"):
        rows = {"text": [], "label": []}
        for i in range(40):
            text, label = f"{split} text {i}", rng.choice(["boat", "fruit", "tree"])
            roll = rng.random()
            if roll < 0.1:
                text = "  "
            elif roll < 0.2:
                label = None
            elif roll < 0.3 and split == "validation":
                label = "dragon"  # not a training label
            rows["text"].append(text)
            rows["label"].append(label)
            if text.strip() and label in ("boat", "fruit", "tree"):
                kept.setdefault(split, []).append((text, label))
            else:
                left_out += 1
        splits[split] = datasets.Dataset.from_dict(rows)
    cfg = make_cfg("data=text_files").data
    train, val, names, counted = _labelled(cfg, datasets.DatasetDict(splits))
    for (texts, labels), split in ((train, "train"), (val, "validation")):
        assert list(zip(texts, [names[k] for k in labels], strict=True)) == kept[split]
    assert counted == left_out > 0


@pytest.mark.parametrize("codec", ["gzip", "bz2", "lzma"])
def test_a_compressed_shard_is_refused_in_one_line_saying_to_decompress_it(codec, tmp_path):
    import importlib

    from turbotrain.core.schema import ConfigError

    plain = tmp_path / "train-000000.tar"
    with TarWriter(str(plain), encoder=False) as sink:
        sink.write(_sample("jpg", "k0", 1, _jpeg(random.Random(0))))
    packed = tmp_path / "train-000001.tar"  # named .tar, compressed inside: the bytes decide
    packed.write_bytes(importlib.import_module(codec).compress(plain.read_bytes()))
    message = (
        f"shard {packed} is compressed: shards are read by random access, which needs plain tars; "
        "decompress them (gunzip, bunzip2, unxz) or write them uncompressed"
    )
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        index_shard(packed, "skip")
