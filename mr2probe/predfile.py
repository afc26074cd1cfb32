"""Test-prediction files (``predictions.npz``): the test labels and the predicted class of every run.

Layout (a plain ``.npz``, read with ``numpy.load``, no pickle):

- ``test_labels``: [N], the true class of each test image;
- ``runs``: [R] strings, "method/seed" of results.json's runs (an episode's runs have seeds of their own);
- ``predictions``: [N, R], column r holding run r's predicted class of every test image;
- ``test_sources``: [N] strings, each test image's source as the feature file names it (an image path relative to
  the dataset root, a WebDataset key, "dataset:split:index"; "test:index" for files without sources), when written
  (:func:`load_prediction_sources`).

Labels are kept in the smallest unsigned integer dtype that holds them (uint8 up to 256 classes) and compressed.
An image's R predictions lie side by side, where the runs mostly agree, so deflate packs this layout about 6×
tighter than one array per run. Files in that older layout (one array per run, "/" in names stored as "__")
are still read.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np

from .atomic import atomic_write

LABELS = "test_labels"
SOURCES = "test_sources"


def compact_labels(a: np.ndarray) -> np.ndarray:
    """Class labels in the smallest unsigned integer dtype that holds them; other arrays unchanged."""
    a = np.asarray(a)
    if a.dtype.kind not in "iu" or a.size == 0 or a.min() < 0:
        return a
    return a.astype(np.min_scalar_type(int(a.max())), copy=False)


def save_predictions(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Write ``{"test_labels": [N], "test_sources": [N], run label: [N], ...}`` in the layout above,
    atomically."""
    runs = [k for k in arrays if k not in (LABELS, SOURCES)]
    columns = [np.asarray(arrays[k]).ravel() for k in runs]
    if len({len(c) for c in columns} | ({len(arrays[LABELS])} if LABELS in arrays else set())) > 1:
        raise ValueError(f"{path}: the runs' test predictions differ in length")
    matrix = np.stack(columns, axis=1) if columns else np.zeros((0, 0), np.int64)
    out = {"runs": np.array(runs, dtype=str), "predictions": compact_labels(matrix)}
    if LABELS in arrays:
        out[LABELS] = compact_labels(arrays[LABELS])
    if SOURCES in arrays:
        out[SOURCES] = np.asarray(arrays[SOURCES], dtype=str)
    save_npz(path, out)


def save_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """``numpy.savez_compressed`` of ``arrays`` to exactly ``path``, atomically."""
    def write(p: Path) -> None:
        with open(p, "wb") as f:  # a file object: savez would append ".npz" to the temporary name
            np.savez_compressed(f, **arrays)

    atomic_write(Path(path), write)


def load_prediction_sources(path: Path) -> np.ndarray | None:
    """The ``test_sources`` of a predictions file ([N] str), None for a file written without them."""
    with np.load(path, allow_pickle=False) as z:
        return z[SOURCES] if SOURCES in z.files else None


def load_predictions(path: Path) -> dict[str, np.ndarray]:
    """``{"test_labels": [N], run label: [N], ...}`` from either layout; OSError/ValueError on a bad file."""
    with np.load(path, allow_pickle=False) as z:
        if "predictions" in z.files and "runs" in z.files:
            matrix, runs = z["predictions"], [str(r) for r in z["runs"]]
            if matrix.ndim != 2 or matrix.shape[1] != len(runs):
                raise ValueError(f"predictions {matrix.shape} does not match {len(runs)} runs")
            out = {LABELS: z[LABELS]} if LABELS in z.files else {}
            return out | dict(zip(runs, np.ascontiguousarray(matrix.T)))
        return {k.replace("__", "/"): z[k] for k in z.files}
