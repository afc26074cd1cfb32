"""Feature store: round trip, validation on open (one-line UserError for each problem)."""
from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import write_by_hand
from mr2probe.errors import UserError
from mr2probe.featurestore import FeatureWriter, base_attrs, describe, read_features, write_features


def test_round_trip_equal(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    splits = {s: (rng.normal(size=(n, 6)).astype(np.float32), rng.integers(0, 3, n), np.arange(n) * 2)
              for s, n in (("train", 50), ("val", 7), ("test", 20))}
    attrs = base_attrs("enc", "ds", ["a", "b", "c"], {"resize": 1}, "ab" * 32)
    path = write_features(tmp_path / "f.h5", attrs, splits, dtype="float32")
    fs = read_features(path)
    assert fs.class_names == ["a", "b", "c"] and fs.dim == 6 and fs.encoder == "enc"
    for s, (x, y, i) in splits.items():
        np.testing.assert_array_equal(fs.splits[s].features, x)
        np.testing.assert_array_equal(fs.splits[s].labels, y)
        np.testing.assert_array_equal(fs.splits[s].index, i)
    assert fs.attrs["weights_sha256"] == "ab" * 32
    assert json.loads(fs.attrs["preprocessing"]) == {"resize": 1}
    assert not Path(str(path) + ".partial").exists()
    d = describe(path)
    assert d["splits"]["val"]["rows"] == 7 and sum(d["splits"]["train"]["per_class"]) == 50


def test_float16_storage(tmp_path: Path) -> None:
    x = np.linspace(-2, 2, 40, dtype=np.float32).reshape(10, 4)
    splits = {s: (x, np.arange(10) % 2, np.arange(10)) for s in ("train", "test")}
    fs = read_features(write_features(tmp_path / "h.h5", base_attrs("e", "d", ["x", "y"]), splits, "float16"))
    assert fs.splits["train"].features.dtype == np.float16
    np.testing.assert_allclose(fs.splits["train"].features, x, atol=2e-3)


def test_hand_written_file_reads(hand_file: Path) -> None:
    fs = read_features(hand_file)
    assert fs.num_classes == 4 and set(fs.splits) == {"train", "test"}


def _mutate(path: Path, fn) -> Path:
    with h5py.File(path, "a") as f:
        fn(f)
    return path


def _set(group: str, name: str, value):
    def fn(f):
        del f[group][name]
        f[group].create_dataset(name, data=value)
    return fn


BAD = {
    "wrong format": (lambda f: f.attrs.__setitem__("format", "other"), "format"),
    "newer version": (lambda f: f.attrs.__setitem__("format_version", 2), "newer"),
    "bad class_names": (lambda f: f.attrs.__setitem__("class_names", "not json"), "class_names"),
    "missing test": (lambda f: f.__delitem__("test"), "test"),
    "incomplete": (lambda f: f["train"].attrs.__setitem__("complete", False), "incomplete"),
    "dim mismatch": (_set("test", "features", np.zeros((40, 9), np.float32)), "dimension"),
    "nan": (_set("train", "features", np.full((80, 8), np.nan, np.float32)), "NaN"),
    "inf": (_set("test", "features", np.full((40, 8), np.inf, np.float32)), "Inf"),
    "label too big": (_set("train", "labels", np.full(80, 4, np.int64)), "outside"),
    "label negative": (_set("train", "labels", np.full(80, -1, np.int64)), "outside"),
    "float labels": (_set("train", "labels", np.zeros(80, np.float32)), "integers"),
    "length mismatch": (_set("train", "labels", np.zeros(79, np.int64)), "rows"),
    "missing index": (lambda f: f["train"].__delitem__("index"), "index"),
    "1-d features": (_set("train", "features", np.zeros(80, np.float32)), "2-D"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_each_validation_error(tmp_path: Path, case: str) -> None:
    fn, needle = BAD[case]
    path = _mutate(write_by_hand(tmp_path / "bad.h5"), fn)
    with pytest.raises(UserError) as e:
        read_features(path)
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("content", [None, b"", b"not an hdf5 file at all" * 10])
def test_missing_empty_or_foreign_file(tmp_path: Path, content) -> None:
    path = tmp_path / "x.h5"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(UserError):
        read_features(path)


def test_truncated_file(tmp_path: Path) -> None:
    path = write_by_hand(tmp_path / "t.h5")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError):
        read_features(path)


def test_writer_resumes_from_rows_written(tmp_path: Path) -> None:
    out = tmp_path / "r.h5"
    attrs = base_attrs("e", "d", ["a", "b"])
    x = np.arange(40, dtype=np.float32).reshape(10, 4)
    w = FeatureWriter(out, attrs, 4, "float32")
    assert w.begin("train", 10) == 0
    w.write("train", 0, x[:4], np.zeros(4, np.int64), np.arange(4))
    w.close()  # "killed" after 4 rows
    w = FeatureWriter(out, attrs, 4, "float32")
    start = w.begin("train", 10)
    assert start == 4 and not out.exists()
    w.write("train", start, x[4:], np.zeros(6, np.int64), np.arange(4, 10))
    w.end("train")
    w.begin("test", 2)
    w.write("test", 0, x[:2], np.array([0, 1]), np.arange(2))
    w.end("test")
    w.finalize()
    np.testing.assert_array_equal(read_features(out).splits["train"].features, x)


def test_writer_refuses_other_settings(tmp_path: Path) -> None:
    out = tmp_path / "r.h5"
    FeatureWriter(out, base_attrs("e", "d", ["a"]), 4, "float32").close()
    with pytest.raises(UserError, match="overwrite"):
        FeatureWriter(out, base_attrs("e", "d", ["a"]), 4, "float16")
