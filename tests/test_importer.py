"""The inputs researchers already have, offline: a plain ``<class>/*`` tree (``imagefolder``, split seeded and
stratified), a Hugging Face ``DatasetDict`` (``hf:PATH``, built here from foolbox's real sample images and saved with
``save_to_disk``), and features made by other tools (``mr2probe import``: an ``.npz``, CLIP_benchmark's folder of
``features_{split}.pt`` / ``targets_{split}.pt``, ``.npy`` files)."""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import _extract_support as support
from mr2probe.cli import app
from mr2probe.datasets import build_dataset
from mr2probe.datasets.folder import stratified_split
from mr2probe.errors import UserError
from mr2probe.experiment import ExperimentConfig, run_experiment
from mr2probe.extract import ExtractConfig, extract
from mr2probe.featurestore import base_attrs, read_features, write_features
from mr2probe.importer import import_features
from mr2probe.trainer import TrainConfig
from test_datasets import SAMPLES, needs_samples, rgb, samples

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tests never go online (a hub name is faked below)
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
CIFAR10 = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def one_line_error(r) -> str:
    """The CLI failed as bad input should: exit 2, one line ``error: ...`` on stderr, no traceback."""
    assert r.exit_code == 2, (r.exit_code, r.output)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert r.exception is None or isinstance(r.exception, SystemExit)
    return lines[0]


# --- imagefolder: a plain tree of class folders -----------------------------------------------------------------


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


# --- hf: a Hugging Face DatasetDict -----------------------------------------------------------------------------


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


# --- mr2probe import ---------------------------------------------------------------------------------------------


def gaussian_splits(k: int = 4, d: int = 8, rows: dict[str, int] | None = None, seed: int = 0,
                    dtype=np.float32) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 3, size=(k, d))
    out = {}
    for split, n in (rows or {"train": 120, "val": 40, "test": 40}).items():
        y = np.arange(n) % k
        out[split] = ((centers[y] + rng.normal(0, 1.5, size=(n, d))).astype(dtype), y.astype(np.int64))
    return out


def save_npz(path: Path, splits: dict, **extra) -> Path:
    arrays = {f"{s}_{kind}": a for s, (x, y) in splits.items() for kind, a in (("features", x), ("labels", y))}
    np.savez(path, **arrays, **extra)
    return path


def save_clip_benchmark(folder: Path, splits: dict) -> Path:
    """CLIP_benchmark's linear-probe cache: FEATURE_ROOT/MODEL_ID/features_{split}.pt and targets_{split}.pt."""
    folder.mkdir(parents=True, exist_ok=True)
    for s, (x, y) in splits.items():
        torch.save(torch.from_numpy(x), folder / f"features_{s}.pt")
        torch.save(torch.from_numpy(y), folder / f"targets_{s}.pt")
    return folder


def per_class(features: Path, out: Path) -> dict[tuple[str, int], list[float]]:
    cfg = ExperimentConfig(features=features, out=out, methods=["ce", "mr2"], seeds=[0], null=False,
                           train=TrainConfig(epochs=2, min_steps=0, batch_size=64, lr=(1e-2,),
                                             wd=(1e-4,), progress=False))
    return {(r["method"], r["seed"]): r["per_class_acc"] for r in run_experiment(cfg)["runs"]}


def test_import_npz_trains_like_the_own_writer(tmp_path: Path) -> None:
    splits = gaussian_splits()
    names = ["ant", "bee", "cat", "dog"]
    src = save_npz(tmp_path / "feats.npz", splits, class_names=np.array(names))
    out = tmp_path / "imported.h5"
    r = CliRunner().invoke(app, ["import", str(src), "--out", str(out), "--encoder", "clip:ViT-B-16/openai",
                                 "--dataset", "pets"])
    assert r.exit_code == 0, r.output
    assert f"wrote {out}" in r.stdout and "K=4" in r.stdout and "D=8" in r.stdout
    fs = read_features(out)
    assert (fs.encoder, fs.dataset, fs.class_names) == ("clip:ViT-B-16/openai", "pets", names)
    assert str(src) in fs.attrs["source"] and fs.attrs["feature_dtype"] == "float32"
    for s, (x, y) in splits.items():
        np.testing.assert_array_equal(fs.splits[s].features, x)
        np.testing.assert_array_equal(fs.splits[s].labels, y)
        np.testing.assert_array_equal(fs.splits[s].index, np.arange(len(y)))
    own = write_features(tmp_path / "own.h5", base_attrs("x", "y", names),
                         {s: (x, y, np.arange(len(y))) for s, (x, y) in splits.items()})
    imported = per_class(out, tmp_path / "run-imported")
    assert imported == per_class(own, tmp_path / "run-own") and len(imported) == 2
    assert not list(tmp_path.glob("*.partial")) and not list(tmp_path.glob("*.tmp"))


def test_import_clip_benchmark_folder_and_npy(tmp_path: Path) -> None:
    splits = gaussian_splits(k=3, d=6, rows={"train": 30, "val": 9, "test": 12}, dtype=np.float16)
    folder = save_clip_benchmark(tmp_path / "feature_root" / "ViT-B-32_openai", splits)
    (tmp_path / "names.txt").write_text("red\ngreen\nblue\n")
    out = import_features(folder, tmp_path / "cb.h5", class_names=tmp_path / "names.txt")
    fs = read_features(out)
    assert fs.class_names == ["red", "green", "blue"] and fs.attrs["feature_dtype"] == "float16"
    assert fs.encoder == "imported" and fs.dataset == "imported"
    for s, (x, y) in splits.items():
        assert fs.splits[s].features.dtype == np.float16
        np.testing.assert_array_equal(fs.splits[s].features, x)
        np.testing.assert_array_equal(fs.splits[s].labels, y)
    # .npy files named {split}_features / {split}_labels, validation → val, names from class_names.json
    npy = tmp_path / "npy"
    npy.mkdir()
    for s, (x, y) in gaussian_splits(k=3, d=6, rows={"train": 30, "validation": 9, "test": 12}).items():
        np.save(npy / f"{s}_features.npy", x)
        np.save(npy / f"{s}_labels.npy", y)
    (npy / "class_names.json").write_text(json.dumps(["a", "b", "c"]))
    np.save(npy / "text_features.npy", np.zeros((3, 6), np.float32))  # not a split: left alone
    fs = read_features(import_features(npy, tmp_path / "npy.h5"))
    assert fs.class_names == ["a", "b", "c"] and set(fs.splits) == {"train", "val", "test"}
    # no names anywhere: "0".."K-1"
    plain = save_clip_benchmark(tmp_path / "plain", gaussian_splits(k=3, rows={"train": 9, "test": 6}))
    assert read_features(import_features(plain, tmp_path / "plain.h5"), load=False).class_names == ["0", "1", "2"]


def _case_nan(d: Path) -> list[str]:
    s = gaussian_splits()
    s["test"][0][3, 1] = np.nan
    return [str(save_npz(d / "x.npz", s))]


def _case_labels_out_of_range(d: Path) -> list[str]:
    return [str(save_npz(d / "x.npz", gaussian_splits(k=4), class_names=np.array(["a", "b", "c"])))]


def _case_negative_labels(d: Path) -> list[str]:
    s = gaussian_splits()
    s["train"][1][0] = -1
    return [str(save_clip_benchmark(d / "cb", s))]


def _case_dim_mismatch(d: Path) -> list[str]:
    s = gaussian_splits()
    s["test"] = gaussian_splits(d=9)["test"]
    return [str(save_clip_benchmark(d / "cb", s))]


def _case_missing_test(d: Path) -> list[str]:
    return [str(save_npz(d / "x.npz", gaussian_splits(rows={"train": 20, "val": 8})))]


def _case_missing_labels(d: Path) -> list[str]:
    folder = save_clip_benchmark(d / "cb", gaussian_splits())
    (folder / "targets_test.pt").unlink()
    return [str(folder)]


def _case_row_mismatch(d: Path) -> list[str]:
    s = gaussian_splits()
    s["val"] = (s["val"][0], s["val"][1][:-1])
    return [str(save_npz(d / "x.npz", s))]


def _case_pickled_pt(d: Path) -> list[str]:
    folder = save_clip_benchmark(d / "cb", gaussian_splits())
    torch.save({"features": torch.zeros(3, 8), "hook": Path("x")}, folder / "features_train.pt")  # not weights-only
    return [str(folder)]


def _case_unknown_split(d: Path) -> list[str]:
    folder = save_clip_benchmark(d / "cb", gaussian_splits())
    np.save(folder / "features_trainval.npy", np.zeros((2, 8), np.float32))
    return [str(folder)]


def _case_unfinished_cache(d: Path) -> list[str]:
    folder = save_clip_benchmark(d / "cb", gaussian_splits())
    (folder / "features_test.pt").rename(folder / "features_test_cache_0.pt")
    (folder / "targets_test.pt").rename(folder / "targets_test_cache_0.pt")
    return [str(folder)]


def _case_corrupt_npz(d: Path) -> list[str]:
    (d / "x.npz").write_bytes(b"PK\x03\x04 not really a zip")
    return [str(d / "x.npz")]


def _case_object_npz(d: Path) -> list[str]:
    s = gaussian_splits()
    return [str(save_npz(d / "x.npz", s, class_names=np.array([{"a": 1}], dtype=object)))]


def _case_wrong_kind(d: Path) -> list[str]:
    (d / "x.csv").write_text("1,2\n")
    return [str(d / "x.csv")]


def _case_absent(d: Path) -> list[str]:
    return [str(d / "absent.npz")]


def _case_int_features(d: Path) -> list[str]:
    s = gaussian_splits()
    s["train"] = (s["train"][0].astype(np.int32), s["train"][1])
    return [str(save_npz(d / "x.npz", s))]


BAD = {  # case → (inputs, what the error line must name)
    "nan": (_case_nan, "NaN or Inf features in 1 rows"),
    "labels-out-of-range": (_case_labels_out_of_range, "labels outside [0, 3)"),
    "negative-labels": (_case_negative_labels, "labels outside [0, 4)"),
    "dim-mismatch": (_case_dim_mismatch, "feature dimension differs between splits: train=8, val=8, test=9"),
    "missing-test": (_case_missing_test, "required split 'test' is missing"),
    "missing-labels": (_case_missing_labels, "split 'test' has features (features_test.pt) but no labels"),
    "row-mismatch": (_case_row_mismatch, "40 feature rows"),
    "pickled-pt": (_case_pickled_pt, "weights_only=True"),
    "unknown-split": (_case_unknown_split, "split 'trainval'"),
    "unfinished-cache": (_case_unfinished_cache, "unfinished CLIP_benchmark cache"),
    "corrupt-npz": (_case_corrupt_npz, "cannot read"),
    "object-npz": (_case_object_npz, "no pickled objects"),
    "wrong-kind": (_case_wrong_kind, "not an .npz file or a folder"),
    "absent": (_case_absent, "not found"),
    "int-features": (_case_int_features, "floating point"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_import_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, case: str) -> None:
    make, needle = BAD[case]
    args = make(tmp_path)
    out = tmp_path / "out" / "f.h5"
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    line = one_line_error(CliRunner().invoke(app, ["import", *args, "--out", str(out)]))
    assert needle in line, line
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # no OUT, .partial or .tmp


def test_import_keeps_an_existing_file(tmp_path: Path) -> None:
    src = save_npz(tmp_path / "x.npz", gaussian_splits())
    out = tmp_path / "f.h5"
    out.write_bytes(b"keep me")
    line = one_line_error(CliRunner().invoke(app, ["import", str(src), "--out", str(out)]))
    assert "--overwrite" in line and out.read_bytes() == b"keep me"
    r = CliRunner().invoke(app, ["import", str(src), "--out", str(out), "--overwrite"])
    assert r.exit_code == 0, r.output
    assert h5py.is_hdf5(out) and read_features(out, load=False).rows == {"train": 120, "val": 40, "test": 40}
