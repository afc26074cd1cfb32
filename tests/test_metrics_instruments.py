"""Per-class instruments of mr2probe.metrics on hand-computable cases: per-class precision and prediction rate,
exact McNemar per class, Benjamini–Hochberg q-values, Jaccard similarity (their use in the report:
test_report_instruments.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binomtest

from mr2probe.metrics import (bh_qvalues, class_share, confusion, exact_mcnemar, hard_instruments, jaccard_matrix,
                              mean_pairwise_jaccard, per_class_paired_test, precision_per_class, prediction_rate)
from mr2probe.results import RunRecord
from mr2probe.summary import seed_stability

K = 6  # classes


def test_precision_and_prediction_rate_on_a_tiny_confusion() -> None:
    y = np.array([0, 0, 0, 1, 1, 2])
    pred = np.array([0, 0, 1, 1, 1, 1])
    conf = confusion(pred, y, 3)
    assert conf.tolist() == [[2, 1, 0], [0, 2, 0], [0, 1, 0]]
    assert precision_per_class(conf) == pytest.approx([1.0, 0.5, 0.0])  # class 2 never predicted → 0
    assert prediction_rate(conf) == pytest.approx([2 / 6, 4 / 6, 0.0])
    assert class_share(conf) == pytest.approx([3 / 6, 2 / 6, 1 / 6])
    assert hard_instruments(conf, np.array([1])) == pytest.approx({"HardPrec": 50.0, "HardRate": 2.0})
    assert hard_instruments(conf, np.array([1, 2])) == pytest.approx({"HardPrec": 25.0, "HardRate": 1.0})
    stacked = np.array([conf, confusion(y, y, 3)])  # leading seed axis
    assert precision_per_class(stacked)[1] == pytest.approx([1.0, 1.0, 1.0])
    assert prediction_rate(stacked)[1] == pytest.approx(class_share(conf))


def test_exact_mcnemar_on_hand_computable_2x2() -> None:
    # b = 1 (method right only), c = 9 (reference right only): p = 2 · P(X ≤ 1), X ~ Bin(10, 1/2) = 2 · 11 / 1024
    assert exact_mcnemar(np.array([1]), np.array([9]))[0] == pytest.approx(22 / 1024)
    assert exact_mcnemar(np.array([0, 3, 0]), np.array([0, 3, 6])) == pytest.approx([1.0, 1.0, 2 / 64])
    rng = np.random.default_rng(0)
    b, c = rng.integers(0, 40, 200), rng.integers(0, 40, 200)
    ref = [binomtest(int(x), int(x + z), 0.5).pvalue if x + z else 1.0 for x, z in zip(b, c)]
    assert exact_mcnemar(b, c) == pytest.approx(ref, rel=1e-9, abs=1e-12)

    # the 2×2 table of class 0 (one seed): 5 both right, 1 only the method, 9 only the reference, 5 both wrong
    y = np.zeros(20, dtype=int)
    method = np.array([1] * 5 + [1] + [0] * 9 + [0] * 5, dtype=bool)
    ref_ok = np.array([1] * 5 + [0] + [1] * 9 + [0] * 5, dtype=bool)
    t = per_class_paired_test(method[None], ref_ok[None], y, 1)
    assert (t["better"][0], t["worse"][0]) == (1, 9) and t["p"][0] == pytest.approx(22 / 1024)
    assert t["delta_acc"][0] == pytest.approx(100 * (6 - 14) / 20)
    # two seeds: per image the seed-mean correctness; an image right in one of the method's two seeds and in
    # neither of the reference's counts as better (d = +1/2), one right in both of each arm not at all
    two = per_class_paired_test(np.array([[1, 1, 0], [0, 1, 0]], dtype=bool),
                                np.array([[0, 1, 1], [0, 1, 1]], dtype=bool), np.zeros(3, dtype=int), 1)
    assert (two["better"][0], two["worse"][0]) == (1, 1) and two["delta_acc"][0] == pytest.approx(100 * -0.5 / 3)


def _bh_by_definition(p: list[float]) -> list[float]:
    """q_i = min over j with p_j ≥ p_i of min(1, m · p_j / rank_j), written out (ranks of the sorted p-values)."""
    m, order = len(p), sorted(range(len(p)), key=lambda i: p[i])
    rank = {i: r + 1 for r, i in enumerate(order)}
    return [min(min(1.0, m * p[j] / rank[j]) for j in range(m) if rank[j] >= rank[i]) for i in range(m)]


def test_benjamini_hochberg_hand_case_and_reference() -> None:
    # sorted 0.01, 0.03, 0.04, 0.2 → m·p/rank = 0.04, 0.06, 0.0533, 0.2 → running min from the top
    assert bh_qvalues(np.array([0.01, 0.04, 0.03, 0.2])) == pytest.approx([0.04, 0.16 / 3, 0.16 / 3, 0.2])
    assert bh_qvalues(np.array([0.01, 0.02, 0.03, 0.04, 0.05])) == pytest.approx([0.05] * 5)  # R: p.adjust "BH"
    q = bh_qvalues(np.array([0.02, np.nan, 0.5]))  # NaN is not a test: m = 2
    assert q[0] == pytest.approx(0.04) and np.isnan(q[1]) and q[2] == pytest.approx(0.5)
    assert bh_qvalues(np.array([0.9, 0.8])) == pytest.approx([0.9, 0.9]) and bh_qvalues(np.array([0.7]))[0] == 0.7
    p = np.random.default_rng(1).uniform(0, 0.2, 40) ** 2
    assert bh_qvalues(p) == pytest.approx(_bh_by_definition(p.tolist()))
    try:
        from statsmodels.stats.multitest import multipletests
    except ImportError:  # statsmodels is not a dependency: the definition above is the reference then
        return
    assert bh_qvalues(p) == pytest.approx(multipletests(p, method="fdr_bh")[1])


def test_jaccard() -> None:
    m = np.array([[1, 1, 0, 0], [0, 1, 1, 0], [1, 1, 0, 0]], dtype=bool)
    assert jaccard_matrix(m) == pytest.approx(np.array([[1, 1 / 3, 1], [1 / 3, 1, 1 / 3], [1, 1 / 3, 1]]))
    assert mean_pairwise_jaccard(m) == pytest.approx((1 / 3 + 1 + 1 / 3) / 3)
    assert math.isnan(mean_pairwise_jaccard(m[:1]))
    # the reference's per-seed hard sets, each seed ranked on its own val accuracy (K = 6: 2 hard classes)
    runs = [{"seed": 0, "val_per_class_acc": [0.1, 0.2, 0.9, 0.9, 0.9, 0.9]},  # {0, 1}
            {"seed": 1, "val_per_class_acc": [0.9, 0.2, 0.1, 0.9, 0.9, 0.9]},  # {1, 2}
            {"seed": 2, "val_per_class_acc": [0.1, 0.2, 0.9, 0.9, 0.9, 0.9]}]  # {0, 1}
    st = seed_stability([RunRecord.from_dict({"method": "ce", "per_class_acc": [], **r}) for r in runs],
                        [f"c{i}" for i in range(K)])
    assert st["value"] == pytest.approx(5 / 9) and st["pairs"] == 3 and st["ranked_on"] == "val"
    assert st["hard_sets"]["1"] == ["c1", "c2"]
