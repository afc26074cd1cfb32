"""The CLI end to end on the bundled real features, and bad input → exit 2 with one line, nothing left behind."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import BUNDLED, run_cli, write_by_hand
from mr2probe.metrics import COLUMNS, DELTA_COLUMNS


def test_train_report_info_on_bundled_file(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = run_cli("train", "--out", str(out), "--methods", "ce,mr2", "--seeds", "2", "--epochs", "5", "-q")
    assert r.returncode == 0, r.stderr
    assert "bundled" in r.stderr
    header = next(line for line in r.stdout.splitlines() if line.startswith("| method"))
    assert [c.strip() for c in header.strip("|").split("|")][:13] == ["method"] + COLUMNS + DELTA_COLUMNS
    res = json.loads((out / "results.json").read_text())
    assert {(x["method"], x["seed"]) for x in res["runs"]} == {("ce", 0), ("ce", 1), ("mr2", 0), ("mr2", 1)}
    mr2 = [x for x in res["runs"] if x["method"] == "mr2"]
    assert all(len(x["margins"]) == 10 for x in mr2)
    assert res["provenance"]["encoder"] == "efficientnet-lite0" and res["provenance"]["splits"]["test"] == 2000
    assert all(0.5 < x["test_acc"] <= 1 for x in res["runs"])  # real features: far above chance (0.1)
    rows = list(csv.DictReader((out / "table.csv").open()))
    assert [row["method"] for row in rows] == ["ce", "mr2"]
    assert list(rows[0])[: 1 + len(COLUMNS + DELTA_COLUMNS)] == ["method"] + COLUMNS + DELTA_COLUMNS
    table_before = (out / "table.md").read_text()
    (out / "table.md").unlink()
    r = run_cli("report", str(out))
    assert r.returncode == 0, r.stderr
    assert (out / "table.md").read_text() == table_before
    r = run_cli("info", str(BUNDLED))
    assert r.returncode == 0 and "D=1280" in r.stdout and "Ankle boot" in r.stdout


def _bad_file(tmp_path: Path, name: str, fn) -> Path:
    path = write_by_hand(tmp_path / f"{name}.h5")
    with h5py.File(path, "a") as f:
        fn(f)
    return path


def _replace(group: str, key: str, value):
    def fn(f):
        del f[group][key]
        f[group].create_dataset(key, data=value)
    return fn


def _cases(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    ok = write_by_hand(tmp_path / "ok.h5")
    not_h5 = tmp_path / "not.h5"
    not_h5.write_text("hello")
    empty_class = tmp_path / "empty_class.h5"
    write_by_hand(empty_class)
    with h5py.File(empty_class, "a") as f:
        y = f["train"]["labels"][()]
        y[y == 3] = 0
        del f["train"]["labels"]
        f["train"].create_dataset("labels", data=y)
    train = lambda p, *extra: (["train", "--features", str(p), "--epochs", "1", "--seeds", "1", *extra])  # noqa: E731
    return {
        "missing file": (train(tmp_path / "nope.h5"), "not found"),
        "not hdf5": (train(not_h5), "not an HDF5"),
        "wrong format": (train(_bad_file(tmp_path, "fmt", lambda f: f.attrs.__setitem__("format", "x"))), "format"),
        "nan": (train(_bad_file(tmp_path, "nan", _replace("train", "features", np.full((80, 8), np.nan)))), "NaN"),
        "label range": (train(_bad_file(tmp_path, "lab", _replace("test", "labels", np.full(40, 9)))), "outside"),
        "dim mismatch": (train(_bad_file(tmp_path, "dim", _replace("test", "features", np.zeros((40, 3))))),
                         "dimension"),
        "incomplete": (train(_bad_file(tmp_path, "inc", lambda f: f["test"].attrs.__setitem__("complete", False))),
                       "resume"),
        "empty class": (train(empty_class), "no training samples"),
        "unknown method": (train(ok, "--methods", "ce,nope"), "unknown method"),
        "unknown head": (train(ok, "--head", "nope"), "unknown head"),
        "unknown adapter": (train(ok, "--adapter", "nope"), "unknown adapter"),
        "negative lr": (train(ok, "--lr", "-1"), "--lr"),
        "zero seeds": (train(ok, "--seeds", "0"), "--seeds"),
        "bad set": (train(ok, "--set", "mr2.nope=1"), "hyperparameter"),
        "unknown encoder": (["extract", "--encoder", "nope", "--dataset", "fashion-mnist", "--out",
                             str(tmp_path / "e.h5")], "unknown encoder"),
        "unknown dataset": (["extract", "--encoder", "efficientnet-lite0", "--dataset", "nope", "--out",
                             str(tmp_path / "e.h5")], "unknown dataset"),
        "info not hdf5": (["info", str(not_h5)], "not an HDF5"),
        "report missing": (["report", str(tmp_path / "norun")], "not found"),
    }


def test_bad_input_exit_2_one_line_nothing_left(tmp_path: Path) -> None:
    failures = []
    for name, (args, needle) in _cases(tmp_path).items():
        out = tmp_path / f"out-{name.replace(' ', '_')}"
        if args[0] == "train":
            args = args + ["--out", str(out), "-q"]
        r = run_cli(*args)
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        ok = (r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr and needle in lines[0]
              and not (out / "results.json").exists() and not (tmp_path / "e.h5").exists())
        if not ok:
            failures.append(f"{name}: rc={r.returncode} stderr={r.stderr[-300:]!r}")
    assert not failures, "\n".join(failures)
