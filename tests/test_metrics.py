"""Metrics on a hand-made accuracy vector (protocol.md), K not divisible by 3."""
from __future__ import annotations

import numpy as np
import pytest

from mr2probe.metrics import Bootstrap, Fold, Groups, class_groups, disparity_row, per_class_accuracy


def test_groups_and_columns_k7() -> None:
    acc = np.array([0.9, 0.2, 0.5, 0.8, 0.4, 1.0, 0.6])
    g = class_groups(acc)
    # K = 7: hard and easy get ⌊7/3⌋ = 2 classes, medium the other 3
    assert g.hard.tolist() == [1, 4] and g.easy.tolist() == [0, 5] and g.medium.tolist() == [2, 3, 6]
    row = disparity_row(acc, g, np.ones(7))
    assert row["Hard"] == pytest.approx(30.0)  # (0.2 + 0.4) / 2
    assert row["Easy"] == pytest.approx(95.0)  # (0.9 + 1.0) / 2
    assert row["Medium"] == pytest.approx(100 * (0.5 + 0.8 + 0.6) / 3)
    assert row["Gap"] == pytest.approx(65.0)
    assert row["Worst"] == pytest.approx(20.0)
    assert row["Worst10"] == pytest.approx(20.0)  # max(1, ⌊0.7⌋) = 1 class
    assert row["mAcc"] == pytest.approx(100 * 4.4 / 7)
    assert row["Std"] == pytest.approx(100 * np.sqrt(np.mean((acc - 4.4 / 7) ** 2)))


def test_all_is_weighted_by_class_counts_and_worst10_k20() -> None:
    acc = np.linspace(0.05, 1.0, 20)
    counts = np.arange(1, 21, dtype=float)
    row = disparity_row(acc, class_groups(acc), counts)
    assert row["All"] == pytest.approx(100 * (acc * counts).sum() / counts.sum())
    assert row["Worst10"] == pytest.approx(100 * (0.05 + 0.1) / 2)  # 10% of 20 = 2 classes


def test_groups_from_reference_ties_are_stable() -> None:
    g = class_groups(np.array([0.5, 0.5, 0.5, 0.5, 0.5, 0.5]))
    assert g.hard.tolist() == [0, 1] and g.easy.tolist() == [4, 5]


def test_per_class_accuracy() -> None:
    y = np.array([0, 0, 1, 1, 1, 2])
    pred = np.array([0, 1, 1, 1, 0, 0])
    np.testing.assert_allclose(per_class_accuracy(pred, y, 3), [0.5, 2 / 3, 0.0])


def test_bootstrap_contains_estimate_and_paired_zero() -> None:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 5, 2000)
    pred = np.where(rng.random(2000) < 0.7, y, (y + 1) % 5)
    groups = Groups(np.array([0, 1]), np.array([2]), np.array([3, 4]))
    boot = Bootstrap(y, [Fold(np.arange(len(y)), groups)], 5, draws=300)
    r = boot.rows([pred, pred], y)
    lo, hi = np.percentile(r["All"][:, 0], [2.5, 97.5])
    acc = (pred == y).mean() * 100
    assert lo < acc < hi and hi - lo < 5
    assert np.all(r["All"][:, 0] == r["All"][:, 1]) and np.all(r["Hard"][:, 0] == r["Hard"][:, 1])  # paired


def test_ties_are_broken_by_the_second_score_and_reported() -> None:
    from mr2probe.metrics import boundary_tie

    acc = np.array([1.0, 1.0, 1.0, 1.0, 0.9, 1.0])  # K = 6: hard = 2 classes; five tie at 1.0
    assert class_groups(acc).hard.tolist() == [0, 4]  # class order decides
    assert class_groups(acc, tiebreak=np.array([0.99, 0.98, 0.95, 0.97, 0.9, 0.99])).hard.tolist() == [2, 4]
    assert boundary_tie(acc) == 5
    assert boundary_tie(acc, np.array([0.99, 0.98, 0.95, 0.97, 0.9, 0.99])) == 0  # the second score separates them
    assert boundary_tie(np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])) == 0
