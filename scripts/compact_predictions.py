"""Rewrite predictions.npz files with their labels in the smallest unsigned integer dtype (compressed), as
``mr2probe train`` writes them; the values are unchanged (checked before the file is replaced).

    python scripts/compact_predictions.py results
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from mr2probe.experiment import atomic_npz, compact_labels, load_npz


def main(roots: list[str]) -> None:
    before = after = 0
    for path in sorted(p for r in roots for p in Path(r).rglob("predictions.npz")):
        arrays = load_npz(path)
        small = {k: compact_labels(v) for k, v in arrays.items()}
        if all(small[k].dtype == v.dtype for k, v in arrays.items()):
            continue
        size = path.stat().st_size
        atomic_npz(path, small)
        back = load_npz(path)
        assert all(np.array_equal(back[k], v) for k, v in arrays.items()), path
        before, after = before + size, after + path.stat().st_size
    print(f"{before:,} → {after:,} bytes")


if __name__ == "__main__":
    main(sys.argv[1:] or ["results"])
