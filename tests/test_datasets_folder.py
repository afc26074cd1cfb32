"""``imagefolder`` (mr2probe.datasets.folder), offline: a plain ``<class>/*`` tree split seeded and stratified, the
split settings in the name, and extraction recording the split."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import _extract_support as support
from mr2probe.datasets import build_dataset
from mr2probe.datasets.folder import stratified_split
from mr2probe.errors import UserError
from mr2probe.extract import ExtractConfig, extract
from mr2probe.featurestore import read_features
from test_datasets import needs_samples, rgb, samples


def plain_tree(root: Path, per_class: dict[str, int]) -> dict[str, list[Path]]:
    """``root/<prefix>/<file>`` with the first n foolbox samples of each prefix (the class)."""
    tree = {}
    for prefix, n in per_class.items():
        tree[prefix] = []
        for path, _ in samples(prefix)[:n]:
            (root / prefix).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, root / prefix / path.name)
            tree[prefix].append(path)
    return tree


@needs_samples
def test_imagefolder_plain_tree_is_split_seeded_and_stratified(tmp_path: Path) -> None:
    tree = plain_tree(tmp_path, {"mnist": 10, "imagenet": 10, "cifar10": 20, "fashionMNIST": 3})
    ds = build_dataset("imagefolder", tmp_path)
    assert ds.name == "imagefolder" and ds.class_names == ["cifar10", "fashionMNIST", "imagenet", "mnist"]
    # ImageFolder order: class by class, files sorted
    whole = [(p, ds.class_names.index(c)) for c in ds.class_names for p in sorted(tree[c])]
    pos = ds.extra["positions"]
    assert set(ds.splits) == set(pos) == {"train", "val", "test"}
    assert np.array_equal(np.sort(np.concatenate(list(pos.values()))), np.arange(len(whole)))  # a partition
    per_class = {s: np.bincount(ds.split(s).labels, minlength=4).tolist() for s in ds.splits}
    # 0.7/0.1/0.2 per class: 20 → 14/2/4, 10 → 7/1/2, 3 → 1/1/1 (each split gets one of a small class)
    assert per_class == {"train": [14, 1, 7, 7], "val": [2, 1, 1, 1], "test": [4, 1, 2, 2]}
    for s, split in ds.splits.items():
        assert np.all(np.diff(pos[s]) > 0)  # each split keeps ImageFolder order
        for i in (0, len(split) - 1):
            path, label = whole[pos[s][i]]
            assert split.labels[i] == label
            np.testing.assert_array_equal(np.asarray(split.image(i)), rgb(path))
    assert "0.7/0.1/0.2" in ds.source and "seed 0" in ds.source and str(tmp_path) in ds.source
    assert ds.extra["split"]["seed"] == 0 and ds.extra["split"]["rows"] == {"train": 29, "val": 5, "test": 9}
    again = build_dataset("imagefolder", tmp_path).extra["positions"]  # seeded: the same split every time
    assert all(np.array_equal(again[s], pos[s]) for s in pos)
    other = build_dataset("imagefolder:seed=1", tmp_path)
    assert not np.array_equal(other.extra["positions"]["test"], pos["test"])
    assert np.bincount(other.split("test").labels).tolist() == per_class["test"]  # still stratified


@needs_samples
def test_imagefolder_split_settings_in_the_name(tmp_path: Path) -> None:
    plain_tree(tmp_path, {"mnist": 10, "cifar10": 10})
    ds = build_dataset("imagefolder:0.5,0,0.5,seed=3", tmp_path)
    assert ds.name == "imagefolder:0.5,0,0.5,seed=3" and set(ds.splits) == {"train", "test"}  # val 0: no val
    assert [len(ds.split(s)) for s in ("train", "test")] == [10, 10]
    assert "0.5/0/0.5" in ds.source and "seed 3" in ds.source
    for bad, needle in (("0.5,0.5", "expected 3"), ("0.6,0.1,0.1", "add up to 1"), ("0,0.5,0.5", "test > 0"),
                        ("x,0.1,0.2", "cannot read"), ("seed=-1", "seed"), ("0.7,0.1,0.2,size=3", "cannot read")):
        with pytest.raises(UserError, match=needle) as e:
            build_dataset(f"imagefolder:{bad}", tmp_path)
        assert "\n" not in str(e.value) and str(e.value).startswith("imagefolder")
    # a tree with train/ and test/ keeps its own split; split settings for it are refused
    for split in ("train", "test"):
        plain_tree(tmp_path / "split" / split, {"mnist": 2})
    assert set(build_dataset("imagefolder", tmp_path / "split").splits) == {"train", "test"}
    with pytest.raises(UserError, match="already has split folders"):
        build_dataset("imagefolder:0.8,0.1,0.1", tmp_path / "split")
    (tmp_path / "split" / "test").rename(tmp_path / "split" / "other")
    with pytest.raises(UserError, match="no test/ folder"):  # half a split layout is not a plain tree
        build_dataset("imagefolder", tmp_path / "split")


def test_stratified_split_small_classes() -> None:
    labels = np.array([0] + [1] * 2 + [2] * 3 + [3] * 100)
    parts = stratified_split(labels, (0.7, 0.1, 0.2), seed=0)
    counts = {s: np.bincount(labels[p], minlength=4).tolist() for s, p in parts.items()}
    assert counts == {"train": [1, 1, 1, 70], "val": [0, 0, 1, 10], "test": [0, 1, 1, 20]}
    assert sorted(np.concatenate(list(parts.values())).tolist()) == list(range(len(labels)))


@needs_samples
def test_extract_plain_tree_records_the_split(tmp_path: Path) -> None:
    plain_tree(tmp_path / "tree", {"mnist": 10, "cifar10": 10})
    out = tmp_path / "f.h5"
    extract(ExtractConfig(support.NAME, "imagefolder", out, root=tmp_path / "tree", workers=0, runtime="torch",
                          progress=False, device="cpu"))
    fs = read_features(out)
    assert fs.dataset == "imagefolder" and "0.7/0.1/0.2" in fs.attrs["source"] and "seed 0" in fs.attrs["source"]
    assert {s: len(sp) for s, sp in fs.splits.items()} == {"train": 14, "val": 2, "test": 4}
