"""The results' table model: one run's results.json (+ test predictions) → :class:`Summary`, the protocol's
columns per method (mean and sample SD over seeds, Δ to the reference paired by seed, bootstrap CIs of the seed
means) with the class groups and how they were ranked. Below the writers (report, plots, bench), which only
render a Summary."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import UserError
from .metrics import (COLUMNS, DELTA_COLUMNS, GROUPS_ON, Bootstrap, Fold, Groups, class_groups, disparity_row,
                      null_name, per_class_accuracy, stratified_halves)

LOWER_IS_BETTER = frozenset({"Std", "Gap"})
HIGHER_IS_BETTER = frozenset(set(COLUMNS) - LOWER_IS_BETTER) | frozenset(DELTA_COLUMNS)

@dataclass
class Summary:
    """The table's content: per method, mean and sample SD (ddof = 1) of every column over seeds, CIs of the
    seed means, and the per-seed data behind them."""

    methods: list[str]
    reference: str
    groups: Groups  # the groups shown (of the first fold; crossfit has one set per half, see ``folds``)
    mean: dict[str, dict[str, float]]
    std: dict[str, dict[str, float]]
    ci: dict[str, dict[str, list[float]]]
    seeds: dict[str, list[int]]
    title: str
    per_seed: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # method → column → [S]
    acc: dict[str, np.ndarray] = field(default_factory=dict)  # method → per-class test accuracy [S, K]
    rank_acc: np.ndarray = field(default_factory=lambda: np.zeros(0))  # reference acc that defined the groups
    class_names: list[str] = field(default_factory=list)
    group_on: str = "val"
    folds: list[Fold] = field(default_factory=list)
    null: str | None = None  # the null control's method name, when the run has one

    def as_dict(self) -> dict[str, Any]:
        return {"title": self.title, "reference": self.reference, "null_control": self.null,
                "groups_on": self.group_on, "groups_on_meaning": GROUPS_ON[self.group_on],
                "groups": self.groups.as_dict(),
                "fold_groups": [f.groups.as_dict() for f in self.folds] if self.group_on == "crossfit" else None,
                "spread": "sample standard deviation over seeds (ddof = 1)",
                "ci": "95% percentile bootstrap of the seed mean: 1000 draws of test images (seed 0) shared by all "
                      "seeds and methods, each draw averaging the per-seed statistic",
                "mean": self.mean, "std": self.std, "ci_values": self.ci, "seeds": self.seeds}

    def best(self, col: str) -> set[str]:
        """Methods holding the best displayed value of ``col`` (empty for CI columns or < 2 candidates); neither
        the null control nor, in Δ columns, the reference is a candidate."""
        cands = [m for m in self.methods if m != self.null and not (col in DELTA_COLUMNS and m == self.reference)]
        return best_of({m: self.mean[m][col] for m in cands}, col) if col in self.mean[self.methods[0]] else set()

    def header(self) -> str:
        """What every table states: spread, groups and CIs."""
        null = f"; null control: `{self.null}`" if self.null else "; no null control in this run"
        return (f"mean ± sample SD over seeds (ddof = 1, %); groups from {self.reference} ranked on "
                f"{self.group_on} ({GROUPS_ON[self.group_on]}){null}; CIs: 95% bootstrap of the seed mean over "
                "test images")


def best_of(values: dict[str, float], col: str) -> set[str]:
    """Keys whose value, rounded to the 2 displayed decimals, is the column's best (ties all returned)."""
    shown = {m: float(f"{v:.2f}") for m, v in values.items() if np.isfinite(v)}
    if len(shown) < 2 or col not in HIGHER_IS_BETTER | LOWER_IS_BETTER:
        return set()
    target = (min if col in LOWER_IS_BETTER else max)(shown.values())
    return {m for m, v in shown.items() if v == target}


def _folds(results: dict[str, Any], ref_runs: list[dict[str, Any]], y: np.ndarray | None,
           predictions: dict[str, np.ndarray] | None, reference: str, group_on: str) -> tuple[list[Fold], np.ndarray]:
    """The scored test rows and their groups, and the ranking accuracy shown (the first fold's)."""
    k = len(results["class_names"])
    n_test = int(np.sum(results["test_class_counts"]))
    everything = np.arange(n_test)
    if group_on in ("val", "test"):
        key = "per_class_acc" if group_on == "test" else "val_per_class_acc"
        if any(key not in r for r in ref_runs):
            raise UserError(f"the reference runs have no {key}; train again or use --groups-on test")
        rank = np.nanmean([r[key] for r in ref_runs], axis=0)
        return [Fold(everything, class_groups(rank))], rank
    if y is None or any(f"{reference}/{r['seed']}" not in predictions for r in ref_runs):
        raise UserError("--groups-on crossfit needs predictions.npz with the reference's test predictions")
    halves = stratified_halves(y, seed=0)
    folds, ranks = [], []
    for rank_rows, score_rows in (halves, halves[::-1]):
        rank = np.mean([per_class_accuracy(predictions[f"{reference}/{r['seed']}"][rank_rows], y[rank_rows], k)
                        for r in ref_runs], axis=0)
        folds.append(Fold(score_rows, class_groups(rank)))
        ranks.append(rank)
    return folds, ranks[0]


def summarize(results: dict[str, Any], predictions: dict[str, np.ndarray] | None = None,
              group_on: str = "val", null: bool = True) -> Summary:
    """Groups from the reference (``group_on``: val, crossfit or test, :data:`GROUPS_ON`), then every column per
    method: mean and sample SD (ddof = 1) over seeds, Δ to the reference paired seed by seed (the i-th seed of a
    method with the reference's i-th), and bootstrap CIs of the seed means (:class:`Bootstrap`). ``null``: keep
    the null control's rows (the reference on disjoint seeds) when the run has them."""
    if group_on not in GROUPS_ON:
        raise UserError(f"--groups-on must be one of {', '.join(GROUPS_ON)}, got {group_on!r}")
    by_method: dict[str, list[dict[str, Any]]] = {}
    for run in sorted(results["runs"], key=lambda r: r["seed"]):
        by_method.setdefault(run["method"], []).append(run)
    reference = results.get("reference") or next(iter(by_method))
    if reference not in by_method:
        raise UserError(f"reference method {reference!r} is not among the runs ({', '.join(by_method)})")
    null_method = null_name(reference) if null_name(reference) in by_method else None
    if not null and null_method:
        del by_method[null_method]
        null_method = None
    ref_runs = by_method[reference]
    y = predictions.get("test_labels") if predictions else None
    k = len(results["class_names"])
    folds, rank_acc = _folds(results, ref_runs, y, predictions, reference, group_on)
    counts = np.asarray(results["test_class_counts"], dtype=float)
    if y is not None:  # fold-wise class counts (crossfit halves)
        fold_counts = [np.bincount(y[f.rows], minlength=k).astype(float) for f in folds]
    else:
        fold_counts = [counts]

    def row(run: dict[str, Any]) -> dict[str, float]:
        """The protocol's columns for one run, averaged over folds (from predictions where a fold is a part)."""
        if len(folds) == 1:
            return disparity_row(np.asarray(run["per_class_acc"], dtype=float), folds[0].groups, counts)
        pred = predictions[f"{run['method']}/{run['seed']}"]
        rows = [disparity_row(per_class_accuracy(pred[f.rows], y[f.rows], k), f.groups, c)
                for f, c in zip(folds, fold_counts)]
        return {c: float(np.mean([r[c] for r in rows])) for c in rows[0]}

    def have_preds(runs: list[dict[str, Any]]) -> bool:
        return y is not None and all(f"{r['method']}/{r['seed']}" in predictions for r in runs)

    boot = Bootstrap(y, folds, k) if y is not None else None
    ref_rows = [row(r) for r in ref_runs]
    ref_t = boot.seed_mean([predictions[f"{reference}/{r['seed']}"] for r in ref_runs]) \
        if boot is not None and have_preds(ref_runs) else None
    mean, std, ci, seeds, per_seed, accs = {}, {}, {}, {}, {}, {}
    for method, runs in by_method.items():
        accs[method] = np.array([r["per_class_acc"] for r in runs], dtype=float)
        rows = [row(r) for r in runs]
        cols = {c: np.array([rw[c] for rw in rows]) for c in COLUMNS}
        for d, c in zip(DELTA_COLUMNS, ("Hard", "Easy", "All")):
            cols[d] = np.array([rw[c] - ref_rows[i][c] if i < len(ref_rows) else np.nan for i, rw in enumerate(rows)])
        mean[method] = {c: float(np.nanmean(v)) for c, v in cols.items()}
        std[method] = {c: sample_sd(v) for c, v in cols.items()}
        seeds[method] = [r["seed"] for r in runs]
        per_seed[method] = cols
        if boot is not None and have_preds(runs):
            t = boot.seed_mean([predictions[f"{method}/{r['seed']}"] for r in runs])
            ci[method] = boot.cis(t, ref_t if method != reference else None)
    prov = results.get("provenance", {})
    title = f"{prov.get('encoder', '?')} on {prov.get('dataset', '?')}, {results.get('head', '?')} head, " \
            f"adapter {results.get('adapter', 'none')}"
    profile = results.get("profile") or {}
    if profile.get("kind", "full") != "full":
        title += f", train: {profile.get('describe', profile.get('text'))}"
    return Summary(list(by_method), reference, folds[0].groups, mean, std, ci, seeds, title, per_seed, accs,
                   rank_acc, list(results["class_names"]), group_on, folds, null_method)


def sample_sd(v: np.ndarray) -> float:
    """Sample standard deviation (ddof = 1) of the finite values; NaN with fewer than two."""
    v = v[np.isfinite(v)]
    return float(np.std(v, ddof=1)) if len(v) > 1 else float("nan")
