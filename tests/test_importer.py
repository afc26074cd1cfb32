"""``mr2probe import`` (mr2probe.importer): features made by other tools (an ``.npz``, CLIP_benchmark's folder of
``features_{split}.pt`` / ``targets_{split}.pt``, ``.npy`` files) become feature files that train like our own;
bad input is one line and writes nothing."""
from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from mr2probe.cli import app
from mr2probe.experiment import ExperimentConfig, run_experiment
from mr2probe.featurestore import base_attrs, read_features, write_features
from mr2probe.importer import import_features
from mr2probe.trainer import TrainConfig

def one_line_error(r) -> str:
    """The CLI failed as bad input should: exit 2, one line ``error: ...`` on stderr, no traceback."""
    assert r.exit_code == 2, (r.exit_code, r.output)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert r.exception is None or isinstance(r.exception, SystemExit)
    return lines[0]


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
