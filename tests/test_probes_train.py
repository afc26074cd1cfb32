"""The exact probes as rows of the same tables: `train --methods ce,logreg,knn`, `--reference logreg`."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import md_rows, run_cli, write_by_hand

from mr2probe.jsonfile import grid_rows

FAST = ["--epochs", "1", "--min-steps", "10", "--batch-size", "64", "-q", "--lr", "1e-2", "--wd", "1e-4"]


@pytest.mark.slow
def test_reference_probes_are_rows_of_the_table(tmp_path: Path) -> None:
    feats = write_by_hand(tmp_path / "f.h5", k=4, n_train=200, n_test=80, val=True)
    out = tmp_path / "run"
    r = run_cli("train", "--features", str(feats), "--out", str(out), "--methods", "ce,logreg,knn", "--seeds", "2",
                *FAST)
    assert r.returncode == 0, r.stderr
    res = json.loads((out / "results.json").read_text())
    runs = {(x["method"], x["seed"]): x for x in res["runs"]}
    assert set(runs) == {("ce", 0), ("ce", 1), ("logreg", 0), ("logreg", 1), ("knn", 0), ("knn", 1),
                         ("ce (null)", 2), ("ce (null)", 3)}
    assert "C" in runs[("logreg", 0)]["hparams"] and "k" in runs[("knn", 0)]["hparams"]
    assert len(grid_rows(runs[("logreg", 0)]["grid"])) > 1  # C chosen on val over a grid
    # no seed dependence: one fit serves every seed
    assert runs[("logreg", 0)]["per_class_acc"] == runs[("logreg", 1)]["per_class_acc"]
    assert runs[("knn", 0)]["test_acc"] > 0.5 and runs[("logreg", 0)]["test_acc"] > 0.5
    table = (out / "table.md").read_text()
    assert {"logreg", "knn"} <= {r["method"] for r in md_rows(table, "method")}
    ref = tmp_path / "ref"
    r = run_cli("train", "--features", str(feats), "--out", str(ref), "--methods", "logreg,ce,all", "--seeds", "1",
                "--reference", "logreg", *FAST)
    assert r.returncode == 0, r.stderr
    res = json.loads((ref / "results.json").read_text())
    assert res["reference"] == "logreg" and res["null_control"] is None
    assert "no null control: the reference logreg does not depend on the seed" in res["notes"]
    assert "groups from logreg" in (ref / "table.md").read_text()
    assert {x["method"] for x in res["runs"]} >= {"logreg", "ce", "mr2", "focal"}
