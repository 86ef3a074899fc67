"""data=imagenet's listing (data/listing.py): torchvision ImageFolder's samples and order, one pass
over the tree, saved and reused while the directories are unchanged."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision import datasets as tvd

from conftest import make_cfg
from turbotrain.data import build_data, listing
from turbotrain.data.listing import FolderSource


@pytest.fixture()
def tree(jpeg_tree, tmp_path):
    root = tmp_path / "tree"
    shutil.copytree(jpeg_tree, root)
    nested = root / "train" / "china" / "b-side" / "deeper"  # '-' sorts before '/': ImageFolder's path order
    nested.mkdir(parents=True)
    shutil.copy(root / "train" / "china" / "001.jpg", nested / "X.JPG")
    shutil.copy(root / "train" / "china" / "002.jpg", root / "train" / "china" / "b.jpeg")
    (root / "train" / "flower" / "notes.txt").write_text("not listed")
    for sibling in ("x1", "x2"):  # two folders side by side in one class: the walk must keep both
        (root / "train" / "flower" / sibling).mkdir()
        shutil.copy(root / "train" / "flower" / "001.jpg", root / "train" / "flower" / sibling / "s.jpg")
    return root


def _args(root, cache_dir, *extra):
    return ("data=imagenet", f"data.root={root}", "data.image_size=32", f"data.cache_dir={cache_dir}", *extra)


def test_the_listing_is_imagefolders_samples_in_its_order(tree):
    reference = tvd.ImageFolder(str(tree / "train"))
    source = FolderSource(listing.scan(tree / "train"))
    assert source.classes == reference.classes
    assert [(source.name(i), int(source.labels[i])) for i in range(len(source))] == reference.samples
    file = Path(reference.samples[3][0]).read_bytes()
    assert torch.equal(source.encoded(3), torch.frombuffer(bytearray(file), dtype=torch.uint8))


@pytest.mark.parametrize("change", ["size", "mtime"])
def test_the_fingerprint_sees_any_files_size_or_mtime(tree, change):
    """It names the split's decoded cache: one file rewritten (its mtime put back) or touched, in
    a class's first folder of several, must give another name."""
    split, victim = tree / "train", tree / "train" / "china" / "000.jpg"
    before = listing.scan(split)
    st = victim.stat()
    if change == "size":
        victim.write_bytes(victim.read_bytes() + b"\0")
        os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    else:
        os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    after = listing.scan(split)
    assert FolderSource(after).fingerprint != FolderSource(before).fingerprint


def test_classes_are_numbered_in_sorted_name_order_whatever_order_the_filesystem_lists(jpeg_tree, tmp_path, monkeypatch):
    """Folders made out of order on purpose, and os.scandir made to list them in reverse: labels
    must still follow sorted names (ImageFolder's), or a checkpoint's class 0 means another class."""
    photo = next((jpeg_tree / "train" / "china").iterdir())
    names = ["zebra", "mango", "apple", "Banana", "9", "10"]  # sorted: 10, 9, Banana, apple, mango, zebra
    for split in ("train", "val"):
        for name in names:
            (tmp_path / split / name).mkdir(parents=True)
            shutil.copy(photo, tmp_path / split / name / "a.jpg")
    real = os.scandir

    class Reversed:
        def __init__(self, path):
            self.entries = sorted(real(path), key=lambda e: e.name, reverse=True)

        def __enter__(self):
            return iter(self.entries)

        def __exit__(self, *exc):
            return False

        def __iter__(self):
            return iter(self.entries)

    monkeypatch.setattr(listing.os, "scandir", Reversed)
    source = FolderSource(listing.scan(tmp_path / "train"))
    assert source.classes == ["10", "9", "Banana", "apple", "mango", "zebra"]
    assert [(Path(source.name(i)).parent.name, int(source.labels[i])) for i in range(len(source))] == [
        (c, i) for i, c in enumerate(source.classes)
    ]


def _count_file_access(monkeypatch):
    """Directories read (os.scandir) and files stat-ed by path (os.stat, os.path.getsize) from here on."""
    read, stated = [], []
    real_scandir, real_stat, real_getsize = os.scandir, os.stat, os.path.getsize
    monkeypatch.setattr(listing.os, "scandir", lambda p: (read.append(str(p)), real_scandir(p))[1])
    monkeypatch.setattr(os, "stat", lambda p, *a, **k: (stated.append(str(p)), real_stat(p, *a, **k))[1])
    monkeypatch.setattr(os.path, "getsize", lambda p: (stated.append(str(p)), real_getsize(p))[1])
    return read, stated


def test_a_start_lists_each_directory_once_and_a_later_start_stats_directories_only(tree, tmp_path, monkeypatch):
    """Before: train/ listed twice by ImageFolder (train, train_eval), then every training file
    stat-ed for the class digest and again for the cache fingerprint, at every start."""
    dirs = [str(d) for split in ("train", "val") for d in [tree / split, *(tree / split).rglob("*")] if d.is_dir()]
    files = {str(p) for p in tree.rglob("*") if p.is_file()}
    cfg = make_cfg(*_args(tree, tmp_path / "c")).data
    read, stated = _count_file_access(monkeypatch)
    data = build_data(cfg)
    assert sorted(read) == sorted(dirs)  # each directory once: train_eval is the same listing
    assert not files & set(stated)  # each file: one DirEntry.stat, in the pass (digest and fingerprint from it)
    image, label = data.train_eval[5]
    assert (image.shape, label) == ((3, 32, 32), int(data.train.dataset.source.labels[5]))
    assert torch.equal(data.train_eval[5][0], data.train_eval[5][0])  # eval transforms: no random crop
    read.clear(), stated.clear()
    again = build_data(cfg)
    assert read == [] and not files & set(stated)  # the saved listing, its directories' mtimes checked
    assert set(dirs) <= set(stated)
    assert again.class_files == data.class_files and len(again.train) == len(data.train)


def test_a_changed_tree_is_listed_again(tree, tmp_path):
    args = _args(tree, tmp_path / "c")
    first = build_data(make_cfg(*args).data)
    shutil.copy(tree / "train" / "flower" / "001.jpg", tree / "train" / "flower" / "new.jpg")
    added = build_data(make_cfg(*args).data)
    assert len(added.train) == len(first.train) + 1 and added.class_files["flower"] != first.class_files["flower"]
    (tree / "train" / "china" / "b-side" / "deeper" / "X.JPG").unlink()  # deep in a class: its folder's mtime
    removed = build_data(make_cfg(*args).data)
    assert len(removed.train) == len(first.train) and removed.class_files["china"] != first.class_files["china"]
    victim = tree / "train" / "china" / "000.jpg"
    stat = victim.stat()
    victim.write_bytes(victim.read_bytes()[:-10])  # rewritten in place: no directory changes
    os.utime(tree / "train" / "china", ns=(stat.st_atime_ns, tree.joinpath("train", "china").stat().st_mtime_ns))
    kept = build_data(make_cfg(*args).data)
    assert kept.class_files == removed.class_files  # the documented limit of the saved listing
    rescanned = build_data(make_cfg(*args, "data.index=rescan").data)
    assert rescanned.class_files["china"] != removed.class_files["china"]


def test_a_listing_whose_folder_vanished_or_that_names_another_split_is_listed_again(tree, tmp_path):
    """A nested folder removed where its parent's mtime did not move (a coarse-mtime filesystem, a
    restored mtime): its files must not be listed from the saved listing. A saved listing under
    this split's name but of another root (a copied cache dir) is not this split's."""
    index = tmp_path / "index"
    train, china = tree / "train", tree / "train" / "china"
    first = listing.load_listing(train, index, rescan=False)
    stat = china.stat()
    shutil.rmtree(china / "b-side")
    os.utime(china, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    gone = FolderSource(listing.load_listing(train, index, rescan=False))
    assert len(gone) == len(FolderSource(first)) - 1 == len(tvd.ImageFolder(str(train)))
    other = tmp_path / "other" / "train"
    shutil.copytree(train, other)  # the same folders with the same mtimes (copystat): only the root tells
    (ours,) = index.iterdir()
    saved = listing.load_listing(other, index, rescan=False)
    (theirs,) = set(index.iterdir()) - {ours}
    shutil.copy(ours, theirs)  # the other split's file now holds this tree's listing
    relisted = FolderSource(listing.load_listing(other, index, rescan=False))
    assert [relisted.name(i) for i in range(len(relisted))] == [FolderSource(saved).name(i) for i in range(len(relisted))]


def test_a_broken_symlink_is_left_out_counted_and_named(tree, caplog):
    link = tree / "train" / "china" / "gone.jpg"
    link.symlink_to(tree / "nowhere.jpg")
    with caplog.at_level("WARNING", logger="turbotrain"):
        source = FolderSource(listing.scan(tree / "train"))
    assert [r.getMessage() for r in caplog.records] == [f"bad sample {link}: No such file or directory (skipped)"]
    assert source.left_out == 1 and len(source) == len(tvd.ImageFolder(str(tree / "train"))) - 1  # ImageFolder lists it


def test_a_damaged_saved_listing_is_named_and_the_split_listed_again(tree, tmp_path, caplog):
    index, train = tmp_path / "index", tree / "train"
    first = FolderSource(listing.load_listing(train, index, rescan=False))
    (saved,) = index.iterdir()
    saved.write_bytes(b"not a listing")
    with pytest.raises(ValueError) as numpy_says:  # the reference: numpy's own words for this file
        np.load(saved)
    with caplog.at_level("WARNING", logger="turbotrain"):
        again = FolderSource(listing.load_listing(train, index, rescan=False))
    root = train.resolve()
    assert caplog.messages == [f"data.index: could not read {saved} ({numpy_says.value}); listing {root} again"]
    assert [again.name(i) for i in range(len(again))] == [first.name(i) for i in range(len(first))]


def test_a_class_digest_is_the_one_earlier_releases_saved_in_checkpoints():
    """A resume compares the digests in its checkpoint with the data's: a digest computed another
    way (a new separator, length or order) would refuse every run saved before the change."""
    assert listing.class_digest(["b.jpg 20", "a.jpg 10"]) == "a7fc89b921bce484"  # sha1 of the sorted lines, 16 digits
    assert listing.class_digest([]) == "da39a3ee5e6b4b0d"  # an empty class: sha1 of nothing


def test_a_listing_saved_before_it_counted_left_out_files_reads_as_none_left_out(tree):
    """Releases before the broken-symlink count saved no left_out (same listing version)."""
    saved = listing.scan(tree / "train")
    meta = json.loads(str(saved["meta"]))
    del meta["left_out"]
    assert FolderSource({**saved, "meta": np.array(json.dumps(meta))}).left_out == 0


def test_a_listing_that_cannot_be_saved_is_named_and_the_split_still_listed(tree, tmp_path, caplog):
    index, train = tmp_path / "index", tree / "train"
    index.write_text("a file where the index folder goes")
    with caplog.at_level("WARNING", logger="turbotrain"):
        source = FolderSource(listing.load_listing(train, index, rescan=False))
    (message,) = caplog.messages
    assert message.startswith(f"data.index: could not save the listing of {train.resolve()}: could not write {index}/train-")
    assert len(source) == len(tvd.ImageFolder(str(train)))
