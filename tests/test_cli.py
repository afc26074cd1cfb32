"""The CLI end to end on the bundled real features, and bad input → exit 2 with one line, nothing left behind."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from conftest import BUNDLED, md_rows, run_cli
from mr2probe.csvnames import csv_name
from mr2probe.metrics import COLUMNS, DELTA_COLUMNS


def test_train_report_info_on_bundled_file(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = run_cli("train", "--out", str(out), "--methods", "ce,mr2", "--seeds", "2", "--epochs", "5", "-q")
    assert r.returncode == 0, r.stderr
    assert "bundled" in r.stderr
    header = next(line for line in r.stdout.splitlines() if "method" in line)  # the compact terminal table
    assert header.split()[:4] == ["method", "All", "Hard", "Worst"] and "ΔHard [95% CI]" in header
    table = r.stdout.split("Minimum detectable")[0].splitlines()  # title, header, rule, one row per method
    assert header.split()[-2:] == ["verdict", "q"] and max(map(len, table)) <= 100
    assert "ce (null)" in r.stdout and "Minimum detectable ΔHard" in r.stdout
    header = list(md_rows((out / "table.md").read_text(), "method")[0])
    assert header[:1 + len(COLUMNS + DELTA_COLUMNS)] == ["method"] + COLUMNS + DELTA_COLUMNS
    res = json.loads((out / "results.json").read_text())
    assert {(x["method"], x["seed"]) for x in res["runs"]} == {("ce", 0), ("ce", 1), ("mr2", 0), ("mr2", 1),
                                                            ("ce (null)", 2), ("ce (null)", 3)}
    mr2 = [x for x in res["runs"] if x["method"] == "mr2"]
    assert all(len(x["margins"]) == 10 for x in mr2)
    assert res["provenance"]["encoder"] == "efficientnet-lite0" and res["provenance"]["splits"]["test"] == 2000
    assert all(0.5 < x["test_acc"] <= 1 for x in res["runs"])  # real features: far above chance (0.1)
    with np.load(out / "predictions.npz") as z:  # labels of 10 classes kept as uint8, one column per run
        assert {z[k].dtype for k in ("predictions", "test_labels")} == {np.dtype(np.uint8)}
        assert z["predictions"].shape == (2000, 6) and len(z["test_labels"]) == 2000
    rows = list(csv.DictReader((out / "table.csv").open()))
    assert [row["method"] for row in rows] == ["ce", "mr2", "ce (null)"]
    assert list(rows[0])[: 1 + len(COLUMNS + DELTA_COLUMNS)] == ["method"] + [csv_name(c) for c in
                                                                              COLUMNS + DELTA_COLUMNS]
    table_before = (out / "table.md").read_text()
    (out / "table.md").unlink()
    r = run_cli("report", str(out))
    assert r.returncode == 0, r.stderr
    assert (out / "table.md").read_text() == table_before
    r = run_cli("info", str(BUNDLED))
    assert r.returncode == 0 and "D=1280" in r.stdout and "Ankle boot" in r.stdout


# Bad input (exit 2, one line, nothing written) is tested case by case in tests/test_cli_errors.py, from the
# table in scripts/bad_inputs.py.
