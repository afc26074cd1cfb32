"""Rewrite predictions.npz files in the layout ``mr2probe train`` writes (``mr2probe.predfile``: one [N, runs]
matrix of the smallest unsigned integer dtype, compressed); the values are unchanged (checked before the file
is replaced). Files already in that layout are left as they are.

    python scripts/compact_predictions.py results
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from mr2probe.predfile import load_predictions, save_predictions


def main(roots: list[str]) -> None:
    before = after = 0
    for path in sorted(p for r in roots for p in Path(r).rglob("predictions.npz")):
        with np.load(path) as z:
            if "predictions" in z.files:
                continue
        arrays = load_predictions(path)
        size = path.stat().st_size
        save_predictions(path, arrays)
        back = load_predictions(path)
        assert list(back) == list(arrays) and all(np.array_equal(back[k], v) for k, v in arrays.items()), path
        before, after = before + size, after + path.stat().st_size
    print(f"{before:,} → {after:,} bytes")


if __name__ == "__main__":
    main(sys.argv[1:] or ["results"])
