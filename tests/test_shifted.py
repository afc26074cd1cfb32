"""Shifted test sets (mr2probe/shifted.py, `report --test-features --class-map`): the run's heads on another
feature file whose classes are renamed and reordered, mapped back by a class map or by name; bad maps → one
error line, exit 2."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest

from conftest import run_cli, write_by_hand
from mr2probe.report import load_results
from mr2probe.shifted import class_map, jaccard, score_shifted

K = 6
PERM = np.array([3, 0, 5, 1, 4, 2])  # the shifted file's class j holds the run's class PERM[j]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("shifted")
    feats = write_by_hand(tmp / "f.h5", k=K, d=6, n_train=180, n_test=120, seed=2)
    out = tmp / "run"
    r = run_cli("train", "--features", str(feats), "--out", str(out), "-q", "--methods", "ce,focal", "--seeds", "2",
                "--epochs", "1", "--min-steps", "10")
    assert r.returncode == 0, r.stderr
    return feats, out


def reordered(src: Path, dst: Path, names: list[str]) -> Path:
    """A copy of ``src`` whose class j is the run's class PERM[j], named ``names[j]``."""
    shutil.copy(src, dst)
    inv = np.argsort(PERM)  # the run's class c is the copy's class inv[c]
    with h5py.File(dst, "r+") as f:
        f.attrs["class_names"] = json.dumps(names)
        for split in ("train", "test"):
            y = f[f"{split}/labels"]
            y[...] = inv[y[...]]
    return dst


def test_class_map_puts_the_run_back_together(run: tuple[Path, Path], tmp_path: Path) -> None:
    """Renamed and reordered classes mapped back: every head predicts the run's own test set again, so each
    method's All is its test accuracy and the hard sets agree (Jaccard 1)."""
    feats, out = run
    other = reordered(feats, tmp_path / "other.h5", [f"x{j}" for j in range(K)])
    cmap = tmp_path / "map.csv"
    pd.DataFrame({"their_class": [f"x{j}" for j in range(K)],
                  "our_class": [f"c{c}" for c in PERM]}).to_csv(cmap, index=False)
    r = score_shifted(out, other, cmap)
    results = load_results(out)
    for method in ("ce", "focal"):
        want = [100 * x.test_acc for x in results.runs if x.method == method]
        assert r.table.loc[method, "All"] == pytest.approx(np.mean(want))
        assert r.table.loc[method, "seeds"] == 2
    assert r.jaccard == 1.0 and r.hard_main == r.hard_shifted and r.images == 120 and r.dropped == 0
    acc = r.per_class[(r.per_class.method == "ce") & (r.per_class.seed == 0)]["accuracy"].to_numpy()
    ce0 = next(x for x in results.runs if x.key == "ce/0")
    np.testing.assert_allclose(acc, 100 * np.array(ce0.per_class_acc))
    # the CLI: files written beside the run's tables, the table printed
    cli = run_cli("report", str(out), "--no-plots", "--test-features", str(other), "--class-map", str(cmap))
    assert cli.returncode == 0, cli.stderr
    table = pd.read_csv(out / "shifted-other.csv").set_index("method")
    assert list(table.columns[:3]) == ["all", "hard", "worst"]
    assert table.loc["ce", "all"] == pytest.approx(r.table.loc["ce", "All"], abs=1e-4)
    assert "Jaccard 1.00" in cli.stdout and (out / "shifted-other-per_class.csv").is_file()


def test_by_name_and_a_class_left_out(run: tuple[Path, Path], tmp_path: Path) -> None:
    """Permuted names without a map are matched by name; a map naming fewer classes leaves the others out."""
    feats, out = run
    named = reordered(feats, tmp_path / "named.h5", [f"c{c}" for c in PERM])
    by_name = score_shifted(out, named)
    results = load_results(out)
    assert by_name.table.loc["ce", "All"] == pytest.approx(np.mean([100 * x.test_acc for x in results.runs
                                                                      if x.method == "ce"]))
    cmap = tmp_path / "part.csv"
    cmap.write_text("theirs,ours\nc0,c0\nc1,c1\nc2,c2\n")
    part = score_shifted(out, named, cmap)
    assert part.images == 60 and part.dropped == 60  # 20 test images per class, 3 classes kept
    assert set(part.per_class[part.per_class.images > 0]["class"]) == {0, 1, 2}


@pytest.mark.parametrize("text, said", [
    ("theirs,ours\nnope,c0\n", "not a class of the shifted file"),
    ("theirs,ours\nc0,nope\n", "not a class of the run"),
    ("theirs,ours\nc0,c0\nc0,c1\n", "mapped twice"),
    ("only\nc0\n", "two columns"),
    ("theirs,ours\n", "two columns"),
])
def test_bad_class_maps_exit_2_with_one_line(run: tuple[Path, Path], tmp_path: Path, text: str, said: str) -> None:
    feats, out = run
    cmap = tmp_path / "bad.csv"
    cmap.write_text(text)
    r = run_cli("report", str(out), "--no-plots", "--test-features", str(feats), "--class-map", str(cmap))
    assert r.returncode == 2 and said in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_class_map_without_test_features_is_refused(run: tuple[Path, Path], tmp_path: Path) -> None:
    r = run_cli("report", str(run[1]), "--no-plots", "--class-map", str(tmp_path / "m.csv"))
    assert r.returncode == 2 and "--class-map needs --test-features" in r.stderr


def test_train_scores_the_shifted_set_and_refuses_a_bad_map_before_training(run: tuple[Path, Path],
                                                                             tmp_path: Path) -> None:
    feats, _ = run
    other = reordered(feats, tmp_path / "other.h5", [f"x{j}" for j in range(K)])
    bad = tmp_path / "bad.csv"
    bad.write_text("theirs,ours\nx0,nope\n")
    args = ["train", "--features", str(feats), "-q", "--methods", "ce", "--seeds", "1", "--epochs", "1",
            "--min-steps", "5", "--test-features", str(other)]
    r = run_cli(*args, "--out", str(tmp_path / "refused"), "--class-map", str(bad))
    assert r.returncode == 2 and "not a class of the run" in r.stderr and not (tmp_path / "refused").exists()
    good = tmp_path / "map.csv"
    good.write_text("theirs,ours\n" + "".join(f"x{j},c{c}\n" for j, c in enumerate(PERM)))
    r = run_cli(*args, "--out", str(tmp_path / "ok"), "--class-map", str(good))
    assert r.returncode == 0, r.stderr
    table = pd.read_csv(tmp_path / "ok" / "shifted-other.csv").set_index("method")
    ce = load_results(tmp_path / "ok").runs[0]
    assert table.loc["ce", "all"] == pytest.approx(100 * ce.test_acc, abs=1e-4) and "Jaccard 1.00" in r.stdout


def test_class_map_units() -> None:
    assert class_map(["a", "b", "z"], ["b", "a"], None).tolist() == [1, 0, -1]
    assert jaccard(np.array([1, 2]), np.array([2, 3])) == pytest.approx(1 / 3)
