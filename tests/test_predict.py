"""Reusable probes: every selected head is saved (safetensors) and `mr2probe predict` applies them."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest

from conftest import BUNDLED, run_cli, write_by_hand
from mr2probe.predfile import load_predictions
from mr2probe.predict import ROW_COLUMNS


@pytest.mark.slow
def test_predict_reproduces_the_runs_test_predictions(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = run_cli("train", "--methods", "ce,mr2,focal", "--seeds", "2", "--epochs", "1", "--min-steps", "20",
                "--head", "cosine", "--scale", "16,32", "--out", str(out), "-q")
    assert r.returncode == 0, r.stderr
    saved = load_predictions(out / "predictions.npz")
    csv = tmp_path / "p.csv"
    r = run_cli("predict", str(out), "--features", str(BUNDLED), "--split", "test", "--out", str(csv))
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(csv)
    heads = [c for c in df.columns if c not in ROW_COLUMNS]
    assert df["source"].tolist() == [f"test:{i}" for i in df["index"]]  # the bundled file predates sources
    assert sorted(heads) == sorted(k for k in saved if k != "test_labels")  # ce, mr2, focal × 2 seeds + 2 null
    for key in heads:
        np.testing.assert_array_equal(df[key].to_numpy(), saved[key])
    np.testing.assert_array_equal(df["label"].to_numpy(), saved["test_labels"])
    n = len(heads)
    assert f"against the run's own test predictions: {n} of {n} heads identical" in " ".join(r.stdout.split())
    # features that differ (here by noise as large as the features' spread) do not reproduce the run: it says so
    moved = tmp_path / "moved.h5"
    shutil.copy(BUNDLED, moved)
    with h5py.File(moved, "r+") as f:
        x = f["test/features"]
        v = x[...].astype(np.float32)
        x[...] = (v + np.random.default_rng(0).normal(0, float(v.std()), v.shape)).astype(x.dtype)
    r = run_cli("predict", str(out), "--features", str(moved), "--out", str(tmp_path / "m.csv"))
    assert r.returncode == 0, r.stderr
    said = " ".join(r.stdout.split())
    moved_df = pd.read_csv(tmp_path / "m.csv")
    worst = min((moved_df[k].to_numpy() == saved[k]).mean() for k in heads)
    assert worst < 0.9 and f"least agreement {worst:.2%}" in said and f"of {n} heads identical" in said
    npz = tmp_path / "p.npz"
    assert run_cli("predict", str(out), "-f", str(BUNDLED), "--split", "train", "-o", str(npz)).returncode == 0
    with np.load(npz) as z:
        assert z["ce__0"].shape == (2000,)


@pytest.mark.slow
def test_predict_refuses_mismatched_features_and_bad_outputs(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert run_cli("train", "--methods", "ce", "--seeds", "1", "--epochs", "1", "--min-steps", "5", "--out",
                   str(out), "-q").returncode == 0
    other = write_by_hand(tmp_path / "other.h5", k=10, d=8)
    cases = [(["-f", str(other), "-o", str(tmp_path / "x.csv")], "trained on D = 1280"),
             (["-f", str(BUNDLED), "--split", "val", "-o", str(tmp_path / "x.csv")], "no split 'val'"),
             (["-f", str(BUNDLED), "-o", str(tmp_path / "x.txt")], "use a .csv or .npz"),
             (["-f", str(BUNDLED), "-o", str(tmp_path / "x.csv"), "--split", "test"], None)]
    for args, needle in cases:
        r = run_cli("predict", str(out), *args)
        if needle is None:
            assert r.returncode == 0, r.stderr
            continue
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], r.stderr
        assert not Path(args[-1]).exists() and not Path(args[args.index("-o") + 1]).exists()
    r = run_cli("predict", str(tmp_path / "nowhere"), "-f", str(BUNDLED), "-o", str(tmp_path / "y.csv"))
    assert r.returncode == 2 and "heads.safetensors not found" in r.stderr
    meta = json.loads((out / "results.json").read_text())
    assert meta["runs"][0]["method"] == "ce"
