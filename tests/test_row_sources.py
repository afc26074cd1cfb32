"""Each feature row's source (image path relative to the dataset root, WebDataset key, "dataset:split:index"):
written by extract and import, read back by ``row_sources`` (files without it: "split:index"), carried by
``predict``'s output and by the predictions.npz of ``train``."""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import _extract_support as support
from conftest import write_by_hand
from mr2probe.cli import app
from mr2probe.datasets import ImageSplit
from mr2probe.experiment import run_experiment
from mr2probe.extract import split_sources
from mr2probe.featurestore import Split, base_attrs, read_features, row_sources, write_features
from mr2probe.importer import import_features
from mr2probe.predfile import load_prediction_sources, load_predictions
from mr2probe.predict import predict_run, write_predictions
from mr2probe.runconfig import config_from_settings


def test_a_file_without_sources_reads_as_split_and_index(tmp_path: Path) -> None:
    path = write_by_hand(tmp_path / "old.h5", n_train=12, n_test=8)  # per features.md, no source dataset
    assert read_features(path).splits["train"].labels.shape == (12,)
    assert row_sources(path, "train").tolist() == [f"train:{i}" for i in range(12)]
    assert row_sources(path, "test").tolist() == [f"test:{i}" for i in range(8)]


def gauss_file(path: Path, k: int = 3, n: int = 30) -> Path:
    rng = np.random.default_rng(0)
    splits = {}
    for s in ("train", "test"):
        y = np.arange(n) % k
        x = (np.eye(k, 4)[y] * 4 + rng.normal(0, 1, (n, 4))).astype(np.float32)
        splits[s] = Split(x, y, np.arange(n) * 10, np.array([f"{s}/c{c}/img{i:03d}.jpg" for i, c in enumerate(y)]))
    return write_features(path, base_attrs("hand", "gauss", [f"c{i}" for i in range(k)]), splits)


def test_sources_round_trip_and_train_and_predict_carry_them(tmp_path: Path) -> None:
    path = gauss_file(tmp_path / "f.h5")
    want = np.array([f"test/c{i % 3}/img{i:03d}.jpg" for i in range(30)])
    assert np.array_equal(row_sources(path, "test"), want)
    cfg = config_from_settings(path, tmp_path / "run", ["ce"], [0], values={"epochs": 1, "min_steps": 5,
                                                                           "null": False, "device": "cpu"},
                               progress=False)
    run_experiment(cfg)
    npz = tmp_path / "run" / "predictions.npz"
    assert np.array_equal(load_prediction_sources(npz), want) and "test_sources" not in load_predictions(npz)
    df = predict_run(tmp_path / "run", path, "test", "cpu")
    assert df["source"].tolist() == want.tolist()
    assert np.array_equal(df["ce/0"].to_numpy(), load_predictions(npz)["ce/0"])
    with np.load(write_predictions(df, tmp_path / "p.npz")) as z:
        assert z["source"].tolist() == want.tolist()


def test_import_stores_given_sources_or_dataset_split_index(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    arrays = {f"{s}_{r}": v for s in ("train", "test") for r, v in
              (("features", rng.normal(size=(6, 3)).astype(np.float32)), ("labels", np.arange(6) % 2))}
    np.savez(tmp_path / "plain.npz", **arrays)
    out = import_features(tmp_path / "plain.npz", tmp_path / "plain.h5", dataset="mine")
    assert row_sources(out, "train").tolist() == [f"mine:train:{i}" for i in range(6)]
    np.savez(tmp_path / "named.npz", **arrays, test_source=np.array([f"x/{i}.png" for i in range(6)]))
    out = import_features(tmp_path / "named.npz", tmp_path / "named.h5")
    assert row_sources(out, "test").tolist() == [f"x/{i}.png" for i in range(6)]


def test_split_sources_by_kind_of_dataset() -> None:
    labels = np.zeros(3, np.int64)
    held = ImageSplit(labels=labels, load=lambda i: None)
    assert split_sources("cifar10", "test", held, np.array([0, 2]), None) == ["cifar10:test:0", "cifar10:test:2"]
    tar = ImageSplit(labels=labels, load=lambda i: None, file=lambda i: Path(f"/d/shard-0.tar:a/b/k{i}.x.jpg"),
                     read=lambda i: b"")
    assert split_sources("wds:x", "train", tar, np.array([1, 2]), "/d") == ["a/b/k1", "a/b/k2"]  # WebDataset keys
    files = ImageSplit(labels=labels, load=lambda i: None, file=lambda i: Path(f"/data/set/train/c/{i}.jpg"))
    assert split_sources("imagefolder", "train", files, np.array([0]), "/data/set") == ["train/c/0.jpg"]


def foolbox_images() -> list[Path]:
    spec = importlib.util.find_spec("foolbox")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("foolbox (pip install --no-deps foolbox) not installed")
    return sorted((Path(list(spec.submodule_search_locations)[0]) / "data").glob("imagenet_*.jpg"))[:8]


def test_extract_stores_each_rows_path_relative_to_the_root(tmp_path: Path) -> None:
    """Real JPEGs (foolbox's ImageNet samples) in a plain class-folder tree, split 50/50 by extract."""
    root = tmp_path / "tree"
    for i, f in enumerate(foolbox_images()):
        (root / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        shutil.copy(f, root / f"c{i % 2}" / f"{i:03d}.jpg")
    out = tmp_path / "f.h5"
    r = CliRunner().invoke(app, ["extract", "--encoder", support.NAME, "--dataset", "imagefolder:0.5,0,0.5",
                                 "--root", str(root), "--batch-size", "2", "--runtime", "torch", "--workers", "0",
                                 "--quiet", "--out", str(out)])
    assert r.exit_code == 0, r.output
    fs = read_features(out)
    seen = []
    for s in ("train", "test"):
        sources = row_sources(out, s)
        assert len(sources) == len(fs.splits[s])
        for src, label in zip(sources, fs.splits[s].labels):
            assert (root / src).is_file() and src.split("/")[0] == fs.class_names[label]
        seen += sources.tolist()
    assert sorted(seen) == sorted(p.relative_to(root).as_posix() for p in root.rglob("*.jpg"))
