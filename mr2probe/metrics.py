"""Per-class disparity metrics (../shared/spec/protocol.md). Everything derives from the accuracy vector.

    acc_k   = fraction of test samples of class k predicted as k
    groups  : classes ranked by the reference method's acc (ascending, ties by class index) on data that is not
              the data scored (val by default; see :class:`Fold`); hard = bottom ⌊K/3⌋, easy = top ⌊K/3⌋,
              medium = the rest
    All     = overall accuracy,  mAcc = mean_k acc_k
    Worst   = min_k acc_k,       Worst10 = mean of the lowest max(1, ⌊K/10⌋) acc_k
    Std     = population std of acc_k over classes (ddof = 0: the classes are the whole population),
    Gap     = Easy − Hard
All values are in % in tables.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

COLUMNS = ["All", "mAcc", "Easy", "Medium", "Hard", "Worst", "Worst10", "Std", "Gap"]
DELTA_COLUMNS = ["ΔHard", "ΔEasy", "ΔAll"]
GROUPS_ON = {"val": "the reference's val accuracy (mean over seeds), scored on all of test",
             "crossfit": "the reference's accuracy on one class-stratified half of test (mean over seeds), scored "
                         "on the other half, and swapped; the two halves averaged",
             "test": "the reference's test accuracy (mean over seeds), scored on the same test images: biased, "
                     "regression to the mean credits any method that differs from the reference"}
"""How the hard / medium / easy groups are ranked (``--groups-on``); the default is the first."""


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


def class_groups(reference_acc: np.ndarray) -> Groups:
    """Bottom third hard, top third easy (⌊K/3⌋ each), the rest medium; stable ranking."""
    k = len(reference_acc)
    order = np.argsort(reference_acc, kind="stable")
    third = k // 3
    return Groups(hard=np.sort(order[:third]), medium=np.sort(order[third:k - third]),
                  easy=np.sort(order[k - third:]))


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
    """95% percentile bootstrap over test samples of statistics *averaged over seeds*.

    The draws are fixed once per test set: within each fold, ``draws`` resamples of its scored rows (with
    replacement; for one fold over all of test the plain bootstrap, for crossfit a resample of each half).
    Every method and every seed is evaluated on the same draws, so for draw b the seed-mean statistic is
    T_b = mean_s t(pred_s, b) and a difference to the reference is T_b(method) − T_b(reference), paired. The CI
    is [2.5, 97.5] percentiles of T_b: an interval of the quantity in the table (the mean over seeds) under
    resampling of test images, with the seeds' predictions held fixed (seed-to-seed spread is the ± SD and the
    null control). t: All = accuracy, Hard / Easy = mean acc_k over the fold's hard / easy classes, each
    averaged over folds. Vectorised: per-class counts of all draws from one bincount over (draw, class) ids."""

    STATS = ("All", "Hard", "Easy")

    def __init__(self, y: np.ndarray, folds: list[Fold], num_classes: int, draws: int = 1000, seed: int = 0
                 ) -> None:
        rng = np.random.default_rng(seed)
        self.shape, self.folds = (draws, num_classes), folds
        self.idx, self.yy, self.offs, self.total = [], [], [], []
        for f in folds:
            idx = f.rows[rng.integers(0, len(f.rows), size=(draws, len(f.rows)))]
            yy = y[idx]
            offs = (np.arange(draws)[:, None] * num_classes + yy).ravel()
            self.idx.append(idx)
            self.yy.append(yy)
            self.offs.append(offs)
            self.total.append(np.bincount(offs, minlength=draws * num_classes).reshape(self.shape))

    def stats(self, pred: np.ndarray) -> dict[str, np.ndarray]:
        """Per draw ([draws]) for one prediction vector: All, Hard, Easy (fractions), averaged over folds."""
        out = {k: np.zeros(self.shape[0]) for k in self.STATS}
        for f, idx, yy, offs, total in zip(self.folds, self.idx, self.yy, self.offs, self.total):
            correct = pred[idx] == yy
            hits = np.bincount(offs, weights=correct.ravel(), minlength=total.size).reshape(self.shape)
            with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a draw without any image of a group: NaN
                acc = hits / total
                out["Hard"] += np.nanmean(acc[:, f.groups.hard], axis=1)
                out["Easy"] += np.nanmean(acc[:, f.groups.easy], axis=1)
            out["All"] += correct.mean(1)
        return {k: v / len(self.folds) for k, v in out.items()}

    def seed_mean(self, preds: list[np.ndarray]) -> dict[str, np.ndarray]:
        """T_b: the per-draw statistics averaged over the seeds' prediction vectors."""
        per = [self.stats(p) for p in preds]
        return {k: np.mean([d[k] for d in per], axis=0) for k in self.STATS}

    @staticmethod
    def cis(t: dict[str, np.ndarray], ref: dict[str, np.ndarray] | None = None) -> dict[str, list[float]]:
        """CIs (in %) of All, Hard, Easy from seed-mean draws ``t``; with ``ref`` also of ΔAll, ΔHard, ΔEasy."""
        def ci(v: np.ndarray) -> list[float]:
            return [100.0 * float(np.nanpercentile(v, 2.5)), 100.0 * float(np.nanpercentile(v, 97.5))]

        out = {k: ci(v) for k, v in t.items()}
        if ref is not None:
            out.update({f"Δ{k}": ci(t[k] - ref[k]) for k in t})
        return out
