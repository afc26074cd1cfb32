"""Per-class disparity metrics (../shared/spec/protocol.md). Everything derives from the accuracy vector.

    acc_k   = fraction of test samples of class k predicted as k
    groups  : classes ranked by the reference method's acc (ascending; ties by a second score, then class index)
              on data that is not the data scored (val by default; see :class:`Fold`); hard = bottom ⌊K/3⌋,
              easy = top ⌊K/3⌋, medium = the rest
    All     = overall accuracy,  mAcc = mean_k acc_k
    Worst   = min_k acc_k,       Worst10 = mean of the lowest max(1, ⌊K/10⌋) acc_k
    Std     = population std of acc_k over classes (ddof = 0: the classes are the whole population),
    Gap     = Easy − Hard
All values are in % in tables.

Instruments from test predictions (confusion C[true, pred], one bincount):
    precision_k = C[k, k] / Σ_i C[i, k]  (0 if k is never predicted),  rate_k = Σ_i C[i, k] / n,
    share_k = Σ_j C[k, j] / n;  HardPrec = mean_{k ∈ hard} precision_k (%),
    HardRate = mean_{k ∈ hard} rate_k / share_k (1 = predicted as often as it occurs)
    per-class paired test against the reference: exact McNemar / sign test on the images whose seed-mean
    correctness differs (:func:`per_class_paired_test`), Benjamini–Hochberg q-values over classes
    Jaccard = |A ∩ B| / |A ∪ B| of hard sets
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

COLUMNS = ["All", "mAcc", "Easy", "Medium", "Hard", "Worst", "Worst10", "Std", "Gap"]
DELTA_COLUMNS = ["ΔHard", "ΔEasy", "ΔAll", "ΔWorst", "ΔGap"]
DELTA_OF = {"ΔHard": "Hard", "ΔEasy": "Easy", "ΔAll": "All", "ΔWorst": "Worst", "ΔGap": "Gap"}
"""Each Δ column and the column it is the difference of (method − reference, paired replicate by replicate)."""


def null_name(reference: str) -> str:
    """The null control's method name: the reference trained again on disjoint seeds, scored like a method."""
    return f"{reference} (null)"


def per_class_accuracy(pred: np.ndarray, y: np.ndarray, num_classes: int) -> np.ndarray:
    """acc_k for every class ([K]); NaN for a class with no samples."""
    total = np.bincount(y, minlength=num_classes)
    hits = np.bincount(y[pred == y], minlength=num_classes)
    with np.errstate(invalid="ignore", divide="ignore"):
        return hits / total


@dataclass
class Groups:
    """Class indices of each group (from the reference method)."""

    hard: np.ndarray
    medium: np.ndarray
    easy: np.ndarray

    def as_dict(self) -> dict[str, list[int]]:
        return {"hard": self.hard.tolist(), "medium": self.medium.tolist(), "easy": self.easy.tolist()}


def class_groups(reference_acc: np.ndarray, tiebreak: np.ndarray | None = None) -> Groups:
    """Bottom third hard, top third easy (⌊K/3⌋ each), the rest medium; classes ranked by ``reference_acc``, ties
    by ``tiebreak`` (ascending; None: not used), then by class index."""
    k = len(reference_acc)
    keys = (np.arange(k),) + (() if tiebreak is None else (np.asarray(tiebreak, dtype=float),))
    order = np.lexsort(keys + (np.asarray(reference_acc, dtype=float),))
    third = k // 3
    return Groups(hard=np.sort(order[:third]), medium=np.sort(order[third:k - third]),
                  easy=np.sort(order[k - third:]))


def boundary_tie(reference_acc: np.ndarray, tiebreak: np.ndarray | None = None) -> int:
    """How many classes share the ranking value at the hard group's edge (the ⌊K/3⌋-th lowest and the next) when
    they tie there, else 0: then the hard group is decided by the tie-break. With ``tiebreak``, a tie means equal
    in both keys."""
    acc = np.asarray(reference_acc, dtype=float)
    third = len(acc) // 3
    if third == 0 or third >= len(acc):
        return 0
    key = np.stack([acc, acc if tiebreak is None else np.asarray(tiebreak, dtype=float)], axis=1)
    order = np.lexsort((key[:, 1], key[:, 0]))
    edge, nxt = key[order[third - 1]], key[order[third]]
    return int(np.all(key == edge, axis=1).sum()) if np.array_equal(edge, nxt) else 0


def worst_fraction(acc: np.ndarray, fraction: float = 0.1) -> float:
    n = max(1, int(len(acc) * fraction))
    return float(np.sort(acc)[:n].mean())


def disparity_row(acc: np.ndarray, groups: Groups, class_counts: np.ndarray) -> dict[str, float]:
    """The protocol's columns (in %) for one accuracy vector; ``class_counts`` weights All."""
    def mean(ix: np.ndarray) -> float:
        return float(acc[ix].mean()) if len(ix) else float("nan")

    easy, hard = mean(groups.easy), mean(groups.hard)
    row = {"All": float((acc * class_counts).sum() / class_counts.sum()), "mAcc": float(acc.mean()),
           "Easy": easy, "Medium": mean(groups.medium), "Hard": hard, "Worst": float(acc.min()),
           "Worst10": worst_fraction(acc), "Std": float(acc.std()), "Gap": easy - hard}
    return {k: 100.0 * v for k, v in row.items()}


@dataclass
class Fold:
    """Test samples scored (``rows``, positions in the test split) with groups ranked on other data."""

    rows: np.ndarray
    groups: Groups


def stratified_halves(y: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two class-stratified halves of positions 0..n−1 (each class split ⌊n_k/2⌋ / ⌈n_k/2⌉ at random)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    order = order[np.argsort(y[order], kind="stable")]  # grouped by class, random within class
    cls = y[order]
    rank = np.arange(len(y)) - np.searchsorted(cls, cls, side="left")
    first = rank < np.bincount(y)[cls] // 2
    return np.sort(order[first]), np.sort(order[~first])


class Bootstrap:
    """Shared, paired bootstrap draws of test images: the image stage of :mod:`~mr2probe.inference`.

    The draws are fixed once per test set: within each fold, ``draws`` resamples of its scored rows (with
    replacement; for one fold over all of test the plain bootstrap, for crossfit a resample of each half). Every
    method and every replicate is scored on the same draws, so a difference to the reference is paired draw by
    draw. A draw is held as how often it takes each row, W [draws, n_f] (exact small integers), so the per-class
    hits of every draw and prediction vector are one matrix product (:meth:`rows`)."""

    def __init__(self, y: np.ndarray, folds: list[Fold], num_classes: int, draws: int = 1000, seed: int = 0
                 ) -> None:
        rng = np.random.default_rng(seed)
        self.shape, self.folds = (draws, num_classes), folds
        self.weights, self.total = [], []
        for f in folds:
            n = len(f.rows)
            pos = rng.integers(0, n, size=(draws, n))  # the drawn positions within the fold
            w = np.bincount((np.arange(draws)[:, None] * n + pos).ravel(), minlength=draws * n)
            self.weights.append(w.reshape(draws, n).astype(np.float32))
            offs = (np.arange(draws)[:, None] * num_classes + y[f.rows][pos]).ravel()
            self.total.append(np.bincount(offs, minlength=draws * num_classes).reshape(self.shape))

    def rows(self, preds: list[np.ndarray], y: np.ndarray, groups: list[list[Groups]] | None = None
             ) -> dict[str, np.ndarray]:
        """Per draw and prediction vector ([draws, R], points of %): All, Hard, Easy, Worst, Gap of each of the R
        vectors ``preds`` (labels ``y``), averaged over the folds. ``groups[r]`` (one :class:`Groups` per fold)
        replace the folds' own groups for vector r, so that every replicate can be scored with groups ranked
        without it. Per-class hits of every draw from one matrix product: hits = W · (onehot(y) ⊙ correct)."""
        k = self.shape[1]
        groups = groups or [[f.groups for f in self.folds]] * len(preds)
        out = {c: np.zeros((self.shape[0], len(preds))) for c in ("All", "Hard", "Easy", "Worst", "Gap")}
        for fi, (f, w, total) in enumerate(zip(self.folds, self.weights, self.total)):
            rows = f.rows
            yy = y[rows]
            onehot = np.eye(k, dtype=np.float32)[yy]  # [n_f, K]
            correct = np.stack([p[rows] == yy for p in preds], axis=1).astype(np.float32)  # [n_f, R]
            hits = (w @ (onehot[:, None, :] * correct[:, :, None]).reshape(len(rows), -1)).reshape(
                self.shape[0], len(preds), k)  # [B, R, K]
            with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a draw without any image of a group: NaN
                acc = hits / total[:, None, :]
                masks = [(np.isin(np.arange(k), g[fi].hard), np.isin(np.arange(k), g[fi].easy)) for g in groups]
                hard = np.stack([np.nanmean(acc[:, r][:, m[0]], axis=1) for r, m in enumerate(masks)], axis=1)
                easy = np.stack([np.nanmean(acc[:, r][:, m[1]], axis=1) for r, m in enumerate(masks)], axis=1)
                out["Worst"] += np.nanmin(acc, axis=2)
            out["Hard"] += hard
            out["Easy"] += easy
            out["Gap"] += easy - hard
            out["All"] += hits.sum(2) / len(rows)
        return {c: 100.0 * v / len(self.folds) for c, v in out.items()}


# ---- per-class instruments (precision, prediction rate, paired per-class tests, MDE, hard-set stability) ------

INSTRUMENT_COLUMNS = ["HardPrec", "HardRate"]
"""Per-seed columns from test predictions (mean ± sample SD over seeds like the others; empty without
predictions): HardPrec = mean precision_k over the hard classes (%), HardRate = mean over the hard classes of
(#pred k)/(#true k), i.e. prediction rate over test share (1.00 = predicted as often as they occur)."""
SIG_COLUMN = "Sig↑/↓"
"""Classes whose accuracy changed against the reference at q < 0.05 (BH over classes), up / down."""


def confusion(pred: np.ndarray, y: np.ndarray, num_classes: int) -> np.ndarray:
    """Counts [K, K], rows the true class, columns the predicted class (one bincount)."""
    k = num_classes
    return np.bincount(np.asarray(y) * k + np.asarray(pred), minlength=k * k).reshape(k, k)


def precision_per_class(conf: np.ndarray) -> np.ndarray:
    """precision_k = (#pred k and true k) / (#pred k); 0 for a class never predicted (sklearn's zero_division=0)."""
    n_pred = conf.sum(-2)
    return np.diagonal(conf, axis1=-2, axis2=-1) / np.maximum(n_pred, 1)


def prediction_rate(conf: np.ndarray) -> np.ndarray:
    """rate_k = (#pred k) / (#test) (compare with the test share (#true k) / (#test), :func:`class_share`)."""
    return conf.sum(-2) / np.maximum(conf.sum((-2, -1))[..., None], 1)


def class_share(conf: np.ndarray) -> np.ndarray:
    """share_k = (#true k) / (#test)."""
    return conf.sum(-1) / np.maximum(conf.sum((-2, -1))[..., None], 1)


def hard_instruments(conf: np.ndarray, hard: np.ndarray) -> dict[str, float]:
    """HardPrec (%) = mean precision_k over ``hard``; HardRate = mean over ``hard`` of (#pred k)/(#true k)
    (classes without test images left out); NaN without hard classes."""
    if not len(hard):
        return {"HardPrec": float("nan"), "HardRate": float("nan")}
    n_true = conf.sum(1)[hard].astype(float)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a fold without any image of the hard classes
        ratio = np.where(n_true > 0, conf.sum(0)[hard] / n_true, np.nan)
        rate = float(np.nanmean(ratio))
    return {"HardPrec": 100.0 * float(precision_per_class(conf)[hard].mean()), "HardRate": rate}


def exact_mcnemar(b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Two-sided exact McNemar (sign) test on discordant counts ``b`` (only the method right) and ``c`` (only the
    reference right): p = min(1, 2 · P(X ≤ min(b, c))), X ~ Binomial(b + c, 1/2) (= scipy.stats.binomtest, which
    for p = 1/2 doubles the smaller tail); p = 1 without discordant pairs. Vectorised over classes."""
    from scipy.special import bdtr  # the binomial CDF (lighter to import than scipy.stats)

    b, c = np.rint(b).astype(np.int64), np.rint(c).astype(np.int64)
    n = b + c
    with np.errstate(invalid="ignore"):
        p = np.minimum(1.0, 2.0 * bdtr(np.minimum(b, c), n, 0.5))
    return np.where(n > 0, p, 1.0)


def bh_qvalues(p: np.ndarray) -> np.ndarray:
    """Benjamini–Hochberg q-values over the finite p-values (NaN stays NaN): q_(i) = min_{j ≥ i} m · p_(j) / j,
    capped at 1, with p_(1) ≤ … ≤ p_(m) (= statsmodels' multipletests(method="fdr_bh")[1])."""
    p = np.asarray(p, dtype=float)
    q = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    if not len(ok):
        return q
    order = ok[np.argsort(p[ok], kind="stable")]
    ranked = p[order] * len(ok) / np.arange(1, len(ok) + 1)
    q[order] = np.minimum(1.0, np.minimum.accumulate(ranked[::-1])[::-1])
    return q


def per_class_paired_test(correct: np.ndarray, ref_correct: np.ndarray, y: np.ndarray, num_classes: int
                          ) -> dict[str, np.ndarray]:
    """Per-class paired test of a method against the reference over test images.

    ``correct`` / ``ref_correct``: [S, N] booleans, seed s of the method paired with seed s of the reference.
    Seeds are combined per image: d_i = mean_s correct[s, i] − mean_s ref_correct[s, i] (the images are the
    independent units; every seed counts). For class k: Δacc_k = mean of d_i over its images (= the seed-mean
    accuracy difference, %), b_k = #images with d_i > 0, c_k = #images with d_i < 0, p_k = exact McNemar /
    sign test on (b_k, c_k) (:func:`exact_mcnemar`; with one seed exactly McNemar's test on the discordant
    pairs), q = Benjamini–Hochberg over the K classes (:func:`bh_qvalues`)."""
    d = np.mean(correct, axis=0) - np.mean(ref_correct, axis=0)
    n = np.bincount(y, minlength=num_classes).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        delta = 100.0 * np.bincount(y, weights=d, minlength=num_classes) / n
    b = np.bincount(y, weights=d > 0, minlength=num_classes)
    c = np.bincount(y, weights=d < 0, minlength=num_classes)
    p = exact_mcnemar(b, c)
    return {"delta_acc": delta, "better": b, "worse": c, "p": p, "q": bh_qvalues(p)}


def jaccard_matrix(members: np.ndarray) -> np.ndarray:
    """Pairwise Jaccard |A ∩ B| / |A ∪ B| of the rows of a boolean membership matrix [n, K] (NaN for two empty
    sets)."""
    m = np.asarray(members, dtype=float)
    inter = m @ m.T
    union = m.sum(1)[:, None] + m.sum(1)[None, :] - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        return inter / union


def mean_pairwise_jaccard(members: np.ndarray) -> float:
    """Mean Jaccard over the n(n−1)/2 pairs of rows (NaN with fewer than two rows)."""
    if len(members) < 2:
        return float("nan")
    j = jaccard_matrix(members)[np.triu_indices(len(members), 1)]
    return float(j[np.isfinite(j)].mean()) if np.isfinite(j).any() else float("nan")
