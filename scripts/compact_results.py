"""Rewrite a results tree's files in the layout ``mr2probe train`` writes now; every value is unchanged (checked
before each file is replaced), files already in that layout are left as they are:

- predictions.npz: one [N, runs] matrix of the smallest unsigned integer dtype, compressed (``mr2probe.predfile``);
- results.json: one line per field of a run, each grid as columns (``mr2probe.jsonfile``).

    python scripts/compact_results.py results
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from mr2probe.jsonfile import atomic_json, grid_columns, grid_rows
from mr2probe.predfile import load_predictions, save_predictions


def compact_predictions(path: Path) -> bool:
    with np.load(path) as z:
        if "predictions" in z.files:
            return False
    arrays = load_predictions(path)
    save_predictions(path, arrays)
    back = load_predictions(path)
    assert list(back) == list(arrays) and all(np.array_equal(back[k], v) for k, v in arrays.items()), path
    return True


def compact_results(path: Path) -> bool:
    text = path.read_text()
    old = json.loads(text)
    new = {**old, "runs": [{**r, "grid": grid_columns(grid_rows(r["grid"]))} if "grid" in r else r
                           for r in old.get("runs", [])]}
    atomic_json(path, new)
    back = json.loads(path.read_text())
    rows = [{**r, "grid": grid_rows(r["grid"])} if "grid" in r else r for r in back.get("runs", [])]
    assert {**back, "runs": rows} == old, path
    return True


def main(roots: list[str]) -> None:
    for name, compact in (("predictions.npz", compact_predictions), ("results.json", compact_results)):
        before = after = 0
        for path in sorted(p for r in roots for p in Path(r).rglob(name)):
            size = path.stat().st_size
            if compact(path):
                before, after = before + size, after + path.stat().st_size
        print(f"{name}: {before:,} → {after:,} bytes")


if __name__ == "__main__":
    main(sys.argv[1:] or ["results"])
