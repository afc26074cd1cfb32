"""``hf:`` (mr2probe.datasets.hf), offline: a Hugging Face ``DatasetDict`` built here from foolbox's real sample images
and saved with ``save_to_disk``, its columns and errors, a hub name (faked), and extraction from it."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

import _extract_support as support
from mr2probe.datasets import build_dataset
from mr2probe.errors import UserError
from mr2probe.extract import ExtractConfig, extract
from mr2probe.featurestore import read_features
from test_datasets import SAMPLES, rgb, samples

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tests never go online (a hub name is faked below)
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
CIFAR10 = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


@pytest.fixture
def hf_dir(tmp_path: Path) -> tuple[Path, dict[str, list[tuple[Path, int]]]]:
    """A DatasetDict of the 20 real CIFAR-10 samples (train 12 / validation 4 / test 4), saved with save_to_disk."""
    if SAMPLES is None or not SAMPLES.is_dir():
        pytest.skip("foolbox sample images not found")
    datasets = pytest.importorskip("datasets")
    items = samples("cifar10")
    parts = {"train": items[:12], "validation": items[12:16], "test": items[16:]}
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=CIFAR10),
                                  "note": datasets.Value("string")})
    dd = datasets.DatasetDict({
        name: datasets.Dataset.from_dict({"image": [{"bytes": p.read_bytes(), "path": None} for p, _ in part],
                                          "label": [y for _, y in part], "note": [p.name for p, _ in part]},
                                         features=features)
        for name, part in parts.items()})
    path = tmp_path / "cifar10-hf"
    dd.save_to_disk(str(path))
    return path, parts


def test_hf_save_to_disk_folder(hf_dir, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    path, parts = hf_dir
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("a local folder went to the hub"))
    ds = build_dataset(f"hf:{path}")
    assert ds.name == f"hf:{path}" and ds.class_names == CIFAR10
    assert set(ds.splits) == {"train", "val", "test"} and ds.extra["hf_splits"]["val"] == "validation"
    assert "validation" in ds.source and str(path) in ds.source
    for ours, theirs in (("train", "train"), ("val", "validation"), ("test", "test")):
        split = ds.split(ours)
        np.testing.assert_array_equal(split.labels, [y for _, y in parts[theirs]])
        assert split.labels.dtype == np.int64
        for i, (p, _) in enumerate(parts[theirs]):
            img = split.image(i)
            assert img.mode == "RGB" and img.size == (32, 32)
            np.testing.assert_array_equal(np.asarray(img), rgb(p))
    # --root instead of a path, a relative path under --root, and a split mapped by name
    assert len(build_dataset("hf:", path).split("test")) == 4
    assert len(build_dataset(f"hf:{path.name},test=validation", path.parent).split("test")) == 4
    np.testing.assert_array_equal(build_dataset(f"hf:{path},test=validation").split("test").labels,
                                  [y for _, y in parts["validation"]])


def test_hf_other_columns_and_errors(hf_dir, tmp_path: Path) -> None:
    import datasets

    path, parts = hf_dir
    dd = datasets.load_from_disk(str(path)).rename_columns({"image": "img", "label": "fine_label"})
    other = tmp_path / "renamed"
    dd.save_to_disk(str(other))
    ds = build_dataset(f"hf:{other},image=img,label=fine_label")
    np.testing.assert_array_equal(np.asarray(ds.split("train").image(0)), rgb(parts["train"][0][0]))

    def refused(name: str, needle: str, root: Path | None = None) -> None:
        with pytest.raises(UserError, match=needle) as e:
            build_dataset(name, root)
        assert "\n" not in str(e.value), e.value

    refused(f"hf:{other}", "no image column 'image'")
    refused(f"hf:{other},image=img,label=note", "not a ClassLabel")
    refused(f"hf:{other},image=note,label=fine_label", "not an Image")
    refused(f"hf:{path},test=nope", "not a split")
    refused(f"hf:{tmp_path}/absent", "does not exist")
    refused(f"hf:{path}/train", "single Dataset")
    refused("hf:", "needs a path")
    only_train = tmp_path / "only-train"
    datasets.DatasetDict({"train": dd["train"]}).save_to_disk(str(only_train))
    refused(f"hf:{only_train},image=img,label=fine_label", "no 'test' split")
    unlabelled = tmp_path / "unlabelled"
    test = dd["test"].map(lambda row: {"fine_label": -1})
    datasets.DatasetDict({"train": dd["train"], "test": test}).save_to_disk(str(unlabelled))
    refused(f"hf:{unlabelled},image=img,label=fine_label", "unlabelled")


def test_hf_hub_name_goes_through_load_dataset(hf_dir, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hub name is handed to datasets.load_dataset (faked here: the tests never go online)."""
    import datasets

    path, _ = hf_dir
    calls = []
    local = datasets.load_from_disk(str(path))

    def fake(name, *args, **kwargs):
        calls.append((name, args))
        if name == "nobody/missing":
            raise FileNotFoundError("Dataset 'nobody/missing' doesn't exist on the Hub or cannot be accessed.")
        return local

    monkeypatch.setattr(datasets, "load_dataset", fake)
    ds = build_dataset("hf:uoft-cs/cifar10,config=plain_text")
    assert calls == [("uoft-cs/cifar10", ("plain_text",))] and ds.class_names == CIFAR10
    assert ds.source.startswith("huggingface hub uoft-cs/cifar10")
    with pytest.raises(UserError, match="cannot load 'nobody/missing'"):
        build_dataset("hf:nobody/missing")


def test_hf_without_the_datasets_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets → ImportError
    with pytest.raises(UserError, match=r"pip install") as e:
        build_dataset(f"hf:{tmp_path}")
    assert "\n" not in str(e.value)


def test_extract_hf_dataset(hf_dir, tmp_path: Path) -> None:
    path, parts = hf_dir
    out = tmp_path / "hf.h5"
    extract(ExtractConfig(support.NAME, f"hf:{path}", out, workers=0, runtime="torch", progress=False, device="cpu"))
    fs = read_features(out)
    assert fs.class_names == CIFAR10 and {s: len(sp) for s, sp in fs.splits.items()} == {"train": 12, "val": 4,
                                                                                           "test": 4}
    np.testing.assert_array_equal(fs.splits["val"].labels, [y for _, y in parts["validation"]])
