"""predictions.npz: the [N, runs] layout round-trips, reads the one-array-per-run layout too, and is smaller."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mr2probe.predfile import LABELS, compact_labels, load_predictions, save_predictions


def runs_like(n: int = 2000, k: int = 10, r: int = 12, acc: float = 0.85, seed: int = 0) -> dict[str, np.ndarray]:
    """Test labels and r runs that are right with probability ``acc`` and otherwise predict another class."""
    g = np.random.default_rng(seed)
    y = g.integers(0, k, n)
    out = {LABELS: y}
    for i in range(r):
        wrong = g.random(n) > acc
        out[f"m{i % 3}/{i}"] = np.where(wrong, (y + g.integers(1, k, n)) % k, y)
    return out


def test_round_trip_keeps_names_order_and_values_in_the_smallest_dtype(tmp_path: Path) -> None:
    arrays = runs_like() | {"ce/0/e2": np.arange(2000) % 10}
    save_predictions(tmp_path / "p.npz", arrays)
    back = load_predictions(tmp_path / "p.npz")
    assert list(back) == list(arrays)
    assert all(np.array_equal(back[k], v) and back[k].dtype == np.uint8 for k, v in arrays.items())
    with np.load(tmp_path / "p.npz", allow_pickle=False) as z:  # plain arrays, no pickled objects
        assert set(z.files) == {"runs", "predictions", LABELS} and z["predictions"].shape == (2000, 13)
        assert list(z["runs"]) == [k for k in arrays if k != LABELS]


def test_the_one_array_per_run_layout_is_read_and_is_larger(tmp_path: Path) -> None:
    arrays = runs_like()
    with open(tmp_path / "old.npz", "wb") as f:
        np.savez_compressed(f, **{k.replace("/", "__"): compact_labels(v) for k, v in arrays.items()})
    old = load_predictions(tmp_path / "old.npz")
    assert list(old) == list(arrays) and all(np.array_equal(old[k], v) for k, v in arrays.items())
    save_predictions(tmp_path / "new.npz", old)
    # an image's runs agree 85%+ of the time: side by side they compress far better than run by run
    assert (tmp_path / "new.npz").stat().st_size < 0.6 * (tmp_path / "old.npz").stat().st_size


def test_labels_and_runs_of_other_lengths_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="differ in length"):
        save_predictions(tmp_path / "p.npz", {LABELS: np.zeros(5, int), "ce/0": np.zeros(4, int)})
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_compact_labels_leaves_negative_and_float_arrays() -> None:
    assert compact_labels(np.array([0, 300])).dtype == np.uint16
    assert compact_labels(np.array([-1, 2])).dtype == np.int64
    assert compact_labels(np.array([0.5])).dtype == np.float64
