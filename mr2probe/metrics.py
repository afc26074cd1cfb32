"""Per-class disparity metrics (../shared/spec/protocol.md). Everything derives from the accuracy vector.

    acc_k   = fraction of test samples of class k predicted as k
    groups  : classes ranked by the reference method's acc (ascending, ties by class index);
              hard = bottom ⌊K/3⌋, easy = top ⌊K/3⌋, medium = the rest
    All     = overall accuracy,  mAcc = mean_k acc_k
    Worst   = min_k acc_k,       Worst10 = mean of the lowest max(1, ⌊K/10⌋) acc_k
    Std     = population std of acc_k over classes (ddof = 0),   Gap = Easy − Hard
All values are in % in tables.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

COLUMNS = ["All", "mAcc", "Easy", "Medium", "Hard", "Worst", "Worst10", "Std", "Gap"]
DELTA_COLUMNS = ["ΔHard", "ΔEasy", "ΔAll"]


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


class Bootstrap:
    """95% percentile bootstrap over the test samples, with the draws fixed once per test set: every method is
    resampled on the same indices, so differences to a reference are paired, and the draws (the costly part)
    are shared by all methods and seeds. Vectorised: all draws' per-class counts come from one bincount over
    (draw, class) ids."""

    def __init__(self, y: np.ndarray, hard: np.ndarray, num_classes: int, draws: int = 1000, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.idx = rng.integers(0, len(y), size=(draws, len(y)))
        self.yy = y[self.idx]
        self.offs = (np.arange(draws)[:, None] * num_classes + self.yy).ravel()
        self.shape, self.hard = (draws, num_classes), hard
        self.total = np.bincount(self.offs, minlength=draws * num_classes).reshape(self.shape)

    def stats(self, pred: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per draw: accuracy over all samples, and the mean accuracy of the hard classes."""
        correct = pred[self.idx] == self.yy
        hits = np.bincount(self.offs, weights=correct.ravel(), minlength=self.total.size).reshape(self.shape)
        with np.errstate(invalid="ignore", divide="ignore"):
            acc = hits / self.total
        return correct.mean(1), np.nanmean(acc[:, self.hard], axis=1)

    def cis(self, pred: np.ndarray, ref: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, list[float]]:
        """CIs (in %) of All and Hard; with ``ref`` (the reference's ``stats``) also of ΔAll and ΔHard."""
        def ci(v: np.ndarray) -> list[float]:
            return [100.0 * float(np.nanpercentile(v, 2.5)), 100.0 * float(np.nanpercentile(v, 97.5))]

        a, h = self.stats(pred)
        out = {"All": ci(a), "Hard": ci(h)}
        if ref is not None:
            out["ΔAll"], out["ΔHard"] = ci(a - ref[0]), ci(h - ref[1])
        return out
