"""The results' table model: one run's results.json (+ test predictions) → :class:`Summary`, the protocol's
columns per method (mean and sample SD over seeds, Δ to the reference paired by seed, bootstrap CIs of the seed
means) with the class groups and how they were ranked, and the per-class instruments from the test predictions
(precision and prediction rate, the hard classes' top confusions, per-class paired tests with BH q-values, the
minimum detectable ΔHard, the stability of the hard set over seeds). Below the writers (report, plots, bench),
which only render a Summary."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd

from .errors import UserError
from .metrics import (COLUMNS, DELTA_COLUMNS, INSTRUMENT_COLUMNS, SIG_COLUMN, Z_ALPHA, Z_POWER, Bootstrap,
                      Fold, Groups, class_groups, confusion, disparity_row, hard_instruments, jaccard_matrix,
                      mean_pairwise_jaccard, minimum_detectable, null_name, per_class_accuracy,
                      per_class_paired_test, precision_per_class, prediction_rate, stratified_halves)
from .settings import EXACT_PROBE, EXACT_PROBE_TOLERANCE, GROUPS_ON, TRAIN

LOWER_IS_BETTER = frozenset({"Std", "Gap"})
HIGHER_IS_BETTER = frozenset(set(COLUMNS) - LOWER_IS_BETTER) | frozenset(DELTA_COLUMNS) | {"HardPrec"}
CI_NAMES = ["All", "Hard", "ΔHard", "ΔEasy", "ΔAll"]  # the columns with a bootstrap CI (``Summary.ci``)
SIG_Q = 0.05  # q-value threshold of the Sig↑/↓ counts
TOP_CONFUSIONS = 3
INSTRUMENTS_DEFINITIONS = {
    "precision": "precision_k = (#pred k and true k) / (#pred k) over all test images, 0 for a class never "
                 "predicted (sklearn's zero_division=0); mean over seeds",
    "prediction_rate": "rate_k = (#pred k) / (#test); compare with test_share_k = (#true k) / (#test); "
                       "rate_over_share_k = (#pred k) / (#true k), 1 = predicted as often as it occurs",
    "HardPrec": "mean precision_k over the hard classes (%), per seed; mean ± sample SD over seeds; crossfit: each "
                "half's hard classes on that half, the halves averaged (like Hard)",
    "HardRate": "mean over the hard classes of (#pred k) / (#true k), per seed, like HardPrec; > 1: the hard "
                "classes are over-predicted (recall bought with precision)",
    "hard_confusions": "per hard class (union over folds), the 3 classes its test images are most often predicted "
                       "as, counts summed over seeds; fraction = count / (#test images of the class × #seeds)",
    "significance": "per class, method vs the reference, seed s paired with the reference's seed s (the first "
                    "min(S_method, S_ref) seeds): per test image d_i = mean_s correct_method − mean_s correct_ref; "
                    "delta_acc_k = mean of d_i over the class's images (points of %); p_k = two-sided exact McNemar "
                    "(sign) test on b_k = #{d_i > 0}, c_k = #{d_i < 0} (one seed: McNemar on the discordant pairs); "
                    "q = Benjamini-Hochberg over the K classes; Sig↑/↓ = #classes with q < 0.05 and delta_acc > 0 "
                    "/ < 0",
    "mde": "MDE = (z_0.975 + z_0.8) × SE(ΔHard) ≈ 2.80 × SE, SE of the table's seed-mean ΔHard, the first of: "
           "null control: SD over its S ≥ 2 seeds (ddof = 1) of its per-seed ΔHard / √S; null control, bootstrap: "
           "bootstrap SD of its seed-mean ΔHard; reference: √2 × SD over S ≥ 2 seeds of the reference's Hard / √S; "
           "reference, bootstrap: √2 × bootstrap SD of the reference's seed-mean Hard (ignores pairing, "
           "conservative); 'alternatives': each one computable",
    "hard_set_stability": "mean over seed pairs of the Jaccard index |A ∩ B| / |A ∪ B| of the reference's per-seed "
                          "hard sets (each seed's classes ranked on its own val accuracy, bottom ⌊K/3⌋)",
}

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
    dataset: str = "?"
    encoder: str = "?"
    # instruments from test predictions (empty without predictions.npz); method → ...
    precision: dict[str, np.ndarray] = field(default_factory=dict)  # per-class precision [S, K] (all of test)
    pred_rate: dict[str, np.ndarray] = field(default_factory=dict)  # per-class prediction rate [S, K]
    share: np.ndarray | None = None  # per-class share of test [K]
    confusions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # top confusions of each hard class
    significance: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # per-class paired test vs ref
    mde: dict[str, Any] | None = None  # minimum detectable ΔHard: value (points), se, source
    seed_stability: dict[str, Any] = field(default_factory=dict)  # Jaccard of the reference's per-seed hard sets
    grid_edges: list[dict[str, Any]] = field(default_factory=list)  # choices at an end of their val grid
    reference_check: dict[str, Any] | None = None  # the reference's All against logreg's (reference_probe_check)

    def instrument_columns(self) -> list[str]:
        """The instrument columns this table has: HardPrec, HardRate where some method has test predictions,
        Sig↑/↓ where some method was tested against the reference."""
        have = [c for c in INSTRUMENT_COLUMNS if any(c in self.mean[m] for m in self.methods)]
        return have + ([SIG_COLUMN] if self.significance else [])

    def sig_counts(self, method: str) -> tuple[int, int] | None:
        """(#classes up, #classes down) at q < 0.05 against the reference; None without the test."""
        sig = self.significance.get(method)
        if sig is None:
            return None
        hit = sig["q"] < SIG_Q
        return int(np.sum(hit & (sig["delta_acc"] > 0))), int(np.sum(hit & (sig["delta_acc"] < 0)))

    def instruments_dict(self) -> dict[str, Any]:
        """The instruments for summary.json (lists in class order; undefined values as null)."""
        with np.errstate(invalid="ignore", divide="ignore"):  # a class without test images: null
            per_class = {m: {"precision": _jsonable(self.precision[m].mean(0)),
                             "prediction_rate": _jsonable(self.pred_rate[m].mean(0)),
                             "rate_over_share": _jsonable(self.pred_rate[m].mean(0) / self.share)}
                         for m in self.methods if m in self.precision}
        sig = {m: {"delta_acc": _jsonable(v["delta_acc"]), "p": _jsonable(v["p"]), "q": _jsonable(v["q"]),
                   "better": v["better"].astype(int).tolist(), "worse": v["worse"].astype(int).tolist(),
                   "up": self.sig_counts(m)[0], "down": self.sig_counts(m)[1]}
               for m, v in self.significance.items()}
        return {"definitions": INSTRUMENTS_DEFINITIONS, "classes": self.class_names,
                "test_share": _jsonable(self.share) if self.share is not None else None,
                "per_class": per_class, "hard_confusions": self.confusions, "significance": sig,
                "sig_threshold_q": SIG_Q}

    def as_dict(self) -> dict[str, Any]:
        return {"title": self.title, "reference": self.reference, "null_control": self.null,
                "groups_on": self.group_on, "groups_on_meaning": GROUPS_ON[self.group_on],
                "groups": self.groups.as_dict(),
                "fold_groups": [f.groups.as_dict() for f in self.folds] if self.group_on == "crossfit" else None,
                "spread": "sample standard deviation over seeds (ddof = 1)",
                "ci": "95% percentile bootstrap of the seed mean: 1000 draws of test images (seed 0) shared by all "
                      "seeds and methods, each draw averaging the per-seed statistic",
                "mean": self.mean, "std": self.std, "ci_values": self.ci, "seeds": self.seeds,
                "minimum_detectable_delta_hard": self.mde, "hard_set_stability_seeds": self.seed_stability,
                "grid_edges": self.grid_edges, "reference_check": self.reference_check,
                "instruments": self.instruments_dict()}

    def numeric_columns(self) -> list[str]:
        """The mean ± SD columns: the protocol's, the Δs, and the instruments this run has (HardPrec, HardRate)."""
        return COLUMNS + DELTA_COLUMNS + [c for c in self.instrument_columns() if c != SIG_COLUMN]

    def frame(self) -> pd.DataFrame:
        """The table as numbers, one row per method (index ``method``): every column's seed mean (%), then
        ``<col>_sd`` (sample SD; NaN for one seed), ``seeds``, ``groups_on``, with the per-class test ``Sig↑`` /
        ``Sig↓`` (counts; empty for the reference), with CIs ``<col>_ci_lo`` / ``_hi``. A method without test
        predictions has NaN instrument cells. Every writer (CSV, the markdown/LaTeX/HTML tables, the cross-run
        summary, ``mr2probe.summarize``) starts from this frame."""
        cols = self.numeric_columns()
        idx = pd.Index(self.methods, name="method")
        df = pd.DataFrame([self.mean[m] for m in self.methods], index=idx).reindex(columns=cols)
        sd = pd.DataFrame([self.std[m] for m in self.methods], index=idx).reindex(columns=cols).add_suffix("_sd")
        df = pd.concat([df, sd], axis=1)
        df["seeds"] = [len(self.seeds[m]) for m in self.methods]
        df["groups_on"] = self.group_on
        if SIG_COLUMN in self.instrument_columns():
            counts = [self.sig_counts(m) or (None, None) for m in self.methods]
            df["Sig↑"] = pd.array([c[0] for c in counts], dtype="Int64")
            df["Sig↓"] = pd.array([c[1] for c in counts], dtype="Int64")
        if self.ci:
            for c in CI_NAMES:
                for i, b in enumerate(("lo", "hi")):
                    df[f"{c}_ci_{b}"] = [self.ci.get(m, {}).get(c, [np.nan] * 2)[i] for m in self.methods]
        return df

    def best(self, col: str) -> set[str]:
        """Methods holding the best displayed value of ``col`` (empty for CI columns or < 2 candidates); neither
        the null control nor, in Δ columns, the reference is a candidate."""
        cands = [m for m in self.methods if m != self.null and not (col in DELTA_COLUMNS and m == self.reference)]
        return best_of({m: self.mean[m][col] for m in cands if col in self.mean[m]}, col)

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
    the null control's rows (the reference on disjoint seeds) when the run has them. With test predictions also
    the instruments (:data:`INSTRUMENTS_DEFINITIONS`): HardPrec / HardRate per seed like the other columns,
    per-class precision and prediction rate, the hard classes' top confusions, per-class paired tests against
    the reference with BH q-values; with or without them the minimum detectable ΔHard
    (:func:`detectable_delta_hard`) and the hard-set stability over the reference's seeds (:func:`seed_stability`)."""
    TRAIN["groups_on"].check_choice(group_on, "--groups-on")
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
        pred = predictions.get(f"{run['method']}/{run['seed']}")
        if pred is None:
            raise UserError(f"--groups-on crossfit needs the test predictions of every run; predictions.npz has "
                            f"none for {run['method']}/{run['seed']}")
        rows = [disparity_row(per_class_accuracy(pred[f.rows], y[f.rows], k), f.groups, c)
                for f, c in zip(folds, fold_counts)]
        return {c: float(np.mean([r[c] for r in rows])) for c in rows[0]}

    def have_preds(runs: list[dict[str, Any]]) -> bool:
        return y is not None and all(f"{r['method']}/{r['seed']}" in predictions for r in runs)

    boot = Bootstrap(y, folds, k) if y is not None else None
    ref_rows = [row(r) for r in ref_runs]
    ref_t = boot.seed_mean([predictions[f"{reference}/{r['seed']}"] for r in ref_runs]) \
        if boot is not None and have_preds(ref_runs) else None
    ins = _Instruments(y, folds, k, list(results["class_names"]))
    if y is not None and have_preds(ref_runs):
        ins.ref_correct = np.array([predictions[f"{reference}/{r['seed']}"] == y for r in ref_runs])
    mean, std, ci, seeds, per_seed, accs, draws = {}, {}, {}, {}, {}, {}, {}
    for method, runs in by_method.items():
        accs[method] = np.array([r["per_class_acc"] for r in runs], dtype=float)
        rows = [row(r) for r in runs]
        cols = {c: np.array([rw[c] for rw in rows]) for c in COLUMNS}
        for d, c in zip(DELTA_COLUMNS, ("Hard", "Easy", "All")):
            cols[d] = np.array([rw[c] - ref_rows[i][c] if i < len(ref_rows) else np.nan for i, rw in enumerate(rows)])
        if have_preds(runs):
            preds = [predictions[f"{method}/{r['seed']}"] for r in runs]
            cols.update(ins.add(method, preds, method != reference))
        mean[method] = {c: float(np.nanmean(v)) for c, v in cols.items()}
        std[method] = {c: sample_sd(v) for c, v in cols.items()}
        seeds[method] = [r["seed"] for r in runs]
        per_seed[method] = cols
        if boot is not None and have_preds(runs):
            draws[method] = ref_t if method == reference else boot.seed_mean(preds)
            ci[method] = boot.cis(draws[method], ref_t if method != reference else None)
    prov = results.get("provenance", {})
    title = f"{prov.get('encoder', '?')} on {prov.get('dataset', '?')}, {results.get('head', '?')} head, " \
            f"adapter {results.get('adapter', 'none')}"
    profile = results.get("profile") or {}
    if profile.get("kind", "full") != "full":
        title += f", train: {profile.get('describe', profile.get('text'))}"
    return Summary(list(by_method), reference, folds[0].groups, mean, std, ci, seeds, title, per_seed, accs,
                   rank_acc, list(results["class_names"]), group_on, folds, null_method,
                   dataset=str(prov.get("dataset", "?")), encoder=str(prov.get("encoder", "?")),
                   precision=ins.precision, pred_rate=ins.rate, share=ins.share, confusions=ins.confusions,
                   significance=ins.significance,
                   mde=detectable_delta_hard(per_seed, draws, reference, null_method),
                   seed_stability=seed_stability(ref_runs, list(results["class_names"])),
                   grid_edges=grid_edges(by_method, {"k": sum(results.get("train_class_counts") or [math.inf])}),
                   reference_check=reference_probe_check(mean, reference, results.get("budget")))


class _Instruments:
    """The per-class instruments of :func:`summarize` from test predictions, method by method (bincount-based;
    loops over seeds and folds only)."""

    def __init__(self, y: np.ndarray | None, folds: list[Fold], k: int, names: list[str]) -> None:
        self.y, self.folds, self.k, self.names = y, folds, k, names
        self.hard = np.unique(np.concatenate([f.groups.hard for f in folds])).astype(int)
        self.ref_correct: np.ndarray | None = None  # [S_ref, N]
        self.precision: dict[str, np.ndarray] = {}
        self.rate: dict[str, np.ndarray] = {}
        self.share = np.bincount(y, minlength=k) / len(y) if y is not None else None
        self.confusions: dict[str, list[dict[str, Any]]] = {}
        self.significance: dict[str, dict[str, np.ndarray]] = {}

    def add(self, method: str, preds: list[np.ndarray], test: bool) -> dict[str, np.ndarray]:
        """Record one method's instruments; return its per-seed columns HardPrec, HardRate ([S])."""
        y, k = self.y, self.k
        per_seed, confs = [], []
        for pred in preds:
            fold_conf = [confusion(pred[f.rows], y[f.rows], k) for f in self.folds]
            parts = [hard_instruments(c, f.groups.hard) for c, f in zip(fold_conf, self.folds)]
            per_seed.append({c: float(np.mean([p[c] for p in parts])) for c in INSTRUMENT_COLUMNS})
            confs.append(np.sum(fold_conf, axis=0))  # the folds partition test (or one fold is all of it)
        conf = np.array(confs)  # [S, K, K]
        self.precision[method] = precision_per_class(conf)
        self.rate[method] = prediction_rate(conf)
        self.confusions[method] = self._top(conf.sum(0), len(preds))
        if test and self.ref_correct is not None:
            n = min(len(preds), len(self.ref_correct))
            correct = np.array([p == y for p in preds[:n]])
            self.significance[method] = per_class_paired_test(correct, self.ref_correct[:n], y, k)
        return {c: np.array([r[c] for r in per_seed]) for c in INSTRUMENT_COLUMNS}

    def _top(self, conf: np.ndarray, n_seeds: int) -> list[dict[str, Any]]:
        """Per hard class: where its errors go (top 3 by count, ties by class index), summed over seeds."""
        rows = conf[self.hard].astype(float)  # [H, K]
        rows[np.arange(len(self.hard)), self.hard] = -1  # not an error
        order = np.argsort(-rows, axis=1, kind="stable")[:, :TOP_CONFUSIONS]
        out = []
        for i, h in enumerate(self.hard):
            n = int(conf[h].sum()) // max(n_seeds, 1)  # test images of the class
            top = [{"to": self.names[j], "index": int(j), "count": int(conf[h, j]),
                    "fraction": float(conf[h, j] / max(n * n_seeds, 1))} for j in order[i] if rows[i, j] > 0]
            out.append({"class": self.names[h], "index": int(h), "test_images": n, "seeds": n_seeds,
                        "accuracy": float(conf[h, h] / max(n * n_seeds, 1)),
                        "errors": int(conf[h].sum() - conf[h, h]), "top": top})
        return out


def detectable_delta_hard(per_seed: dict[str, dict[str, np.ndarray]], draws: dict[str, dict[str, np.ndarray]],
                          reference: str, null: str | None) -> dict[str, Any] | None:
    """Minimum detectable ΔHard (points of %; 80% power, two-sided α = 0.05): MDE = (z_0.975 + z_0.8) · SE with
    SE the standard error of the table's seed-mean ΔHard, from the first available of

    1. ``null control``: SE = SD_null / √S, SD_null the sample SD (ddof = 1) of the null control's S ≥ 2 per-seed
       ΔHard (its spread is what ΔHard looks like without an effect, on this test set) — but never below case 2:
       a few seeds can agree by chance (ΔHard moves in steps of one test image; three seeds once gave SD 0), and
       the MDE then claims a precision the test set does not have;
    2. ``null control, bootstrap`` (one seed, or larger than case 1): SE = bootstrap SD of its seed-mean ΔHard
       (the CIs' draws);
    3. ``reference`` (no null control, S ≥ 2 reference seeds): SE = √2 · SD_ref(Hard) / √S — case 1 with the
       null's per-seed ΔHard = Hard(null_s) − Hard(ref_s) of two independent seeds, each as variable as the
       reference's;
    4. ``reference, bootstrap`` (one reference seed): SE = √2 · bootstrap SD of the reference's seed-mean Hard.
       This treats the two arms as scored on independent test sets and ignores the pairing on the same images,
       so it over-states the MDE (on the Fashion-MNIST × EfficientNet-Lite0 run about 12× case 1);

    None when none applies. ``alternatives`` holds every one that can be computed, to compare."""
    factor = Z_ALPHA + Z_POWER
    alt: dict[str, float] = {}
    d = per_seed[null]["ΔHard"] if null is not None else np.zeros(0)
    d = d[np.isfinite(d)]
    if len(d) >= 2:
        alt["null control"] = float(np.std(d, ddof=1) / math.sqrt(len(d)))
    if null is not None and null in draws and reference in draws:
        alt["null control, bootstrap"] = _boot_sd(draws[null]["Hard"] - draws[reference]["Hard"])
    h = per_seed[reference]["Hard"]
    h = h[np.isfinite(h)]
    if len(h) >= 2:
        alt["reference"] = float(math.sqrt(2.0) * np.std(h, ddof=1) / math.sqrt(len(h)))
    if reference in draws:
        alt["reference, bootstrap"] = math.sqrt(2.0) * _boot_sd(draws[reference]["Hard"])
    alt = {k: v for k, v in alt.items() if np.isfinite(v)}
    if not alt:
        return None
    why = "no null control" if null is None else "null control without predictions or 2 seeds"
    describe = {"null control": f"from the null control: {factor:.2f} × SD over {len(d)} seeds of its ΔHard / "
                                f"√{len(d)}",
                "null control, bootstrap": f"from the null control: {factor:.2f} × bootstrap SE of its seed-mean "
                                           "ΔHard (one seed)",
                "reference": f"{why}, from the reference: {factor:.2f} × √2 × SD over {len(h)} seeds of its Hard / "
                             f"√{len(h)}",
                "reference, bootstrap": f"{why}, from the reference: {factor:.2f} × √2 × bootstrap SE of its "
                                        "seed-mean Hard (one seed; ignores the pairing on the same test images, "
                                        "conservative)"}
    source = next(iter(alt))
    if source == "null control" and alt.get("null control, bootstrap", 0.0) > alt[source]:
        source = "null control, bootstrap"
        describe[source] = (f"from the null control: {factor:.2f} × bootstrap SE of its seed-mean ΔHard, larger here "
                            f"than its SD over {len(d)} seeds / √{len(d)}")
    return {"value": minimum_detectable(alt[source]), "se": alt[source], "factor": factor, "source": source,
            "describe": describe[source], "alternatives": {k: minimum_detectable(v) for k, v in alt.items()}}


def _boot_sd(v: np.ndarray) -> float:
    """Sample SD (in points of %) of bootstrap draws (fractions), NaN draws left out."""
    v = 100.0 * v[np.isfinite(v)]
    return float(np.std(v, ddof=1)) if len(v) > 1 else float("nan")


def seed_stability(ref_runs: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """Mean pairwise Jaccard of the reference's per-seed hard sets, each seed ranked on its own val accuracy
    (on test where the runs have no val accuracy); the per-seed hard sets too. value None with one seed."""
    key, on = ("val_per_class_acc", "val") if all("val_per_class_acc" in r for r in ref_runs) else \
        ("per_class_acc", "test")
    members = np.zeros((len(ref_runs), len(names)), dtype=bool)
    for i, r in enumerate(ref_runs):
        members[i, class_groups(np.asarray(r[key], dtype=float)).hard] = True
    j = mean_pairwise_jaccard(members)
    return {"value": j if np.isfinite(j) else None, "seeds": len(ref_runs),
            "pairs": len(ref_runs) * (len(ref_runs) - 1) // 2, "ranked_on": on,
            "hard_sets": {str(r["seed"]): [names[c] for c in np.flatnonzero(m)] for r, m in zip(ref_runs, members)}}


GRID_EDGE_MIN_VALUES = 3  # a grid of two values has no inside: every choice is at one of its ends
GRID_EDGE_RISE = 0.001  # [choice] val-score gain over the next value inwards (0.1 point) that counts as still rising


def grid_edges(runs_by_method: dict[str, list[dict[str, Any]]], ceilings: dict[str, float] | None = None
               ) -> list[dict[str, Any]]:
    """Hyperparameters chosen at an end of their val grid (numeric grids of ≥ 3 values, from each run's ``grid``)
    where the val score was still rising there: the chosen point beats the same point with that hyperparameter
    one grid value inwards by more than :data:`GRID_EDGE_RISE`. A wider grid might do better; for the reference
    it means it may be under-fit. Only the hyperparameters the grid records are compared (a reference probe
    records fixed ones beside them); an upper end at its ``ceilings`` value (kNN's k at the number of training
    rows) cannot be widened and is not flagged. One row per (method, hyperparameter, end): the value, the grid's
    range, in how many of the method's runs (seeds × episodes) and the mean rise there (points)."""
    ceilings = ceilings or {}
    rows = []
    for method, runs in runs_by_method.items():
        hits: dict[tuple[Any, ...], list[float]] = {}
        for run in runs:
            entries = run.get("grid") or []
            grid = [g["hparams"] for g in entries]
            score = {json.dumps(g["hparams"], sort_keys=True): g["val_score"] for g in entries}
            recorded = {k for h in grid for k in h}
            chosen = {k: v for k, v in run.get("hparams", {}).items() if k in recorded}
            mine = score.get(json.dumps(chosen, sort_keys=True))
            for name, value in chosen.items():
                values = sorted({h[name] for h in grid if _is_number(h.get(name))})
                if not _is_number(value) or len(values) < GRID_EDGE_MIN_VALUES or values[0] < value < values[-1]:
                    continue
                if value == values[-1] and value >= ceilings.get(name, float("inf")):
                    continue
                inward = values[1] if value == values[0] else values[-2]
                theirs = score.get(json.dumps({**chosen, name: inward}, sort_keys=True))
                if mine is None or theirs is None or mine - theirs <= GRID_EDGE_RISE + 1e-9:  # 1e-9: float noise
                    continue
                key = (name, "lowest" if value == values[0] else "highest", value, values[0], values[-1])
                hits.setdefault(key, []).append(100 * (mine - theirs))
        rows += [{"method": method, "param": name, "end": end, "value": value, "grid_min": lo, "grid_max": hi,
                  "runs": len(rise), "of": len(runs), "rise": float(np.mean(rise))}
                 for (name, end, value, lo, hi), rise in sorted(hits.items())]
    return rows


def reference_probe_check(mean: dict[str, dict[str, float]], reference: str,
                          budget: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The reference against the exact logistic regression on the same features: gap = All(logreg) − All(reference)
    (seed means, points) and ``under_fit`` = gap > :data:`EXACT_PROBE_TOLERANCE` (a budget or grid too small for
    these features), with the run's step budget (``steps``; ``calibrated``/``reached`` under the reach-logreg
    rule). None without a ``logreg`` row, or when logreg is the reference."""
    if EXACT_PROBE not in mean or reference not in mean or reference == EXACT_PROBE:
        return None
    gap = mean[EXACT_PROBE]["All"] - mean[reference]["All"]
    budget = budget or {}
    calibration = budget.get("calibration")
    return {"probe": EXACT_PROBE, "gap": gap, "tolerance": EXACT_PROBE_TOLERANCE,
            "under_fit": bool(gap > EXACT_PROBE_TOLERANCE), "steps": budget.get("steps"),
            "calibrated": calibration is not None, "reached": None if calibration is None else calibration["reached"]}


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def hard_set_stability(items: Sequence[tuple[str, Summary]]) -> dict[str, dict[str, Any]]:
    """Across runs of the same dataset (``Summary.dataset``, from results["provenance"]["dataset"]): pairwise
    Jaccard of the runs' hard sets (the groups shown; by class name) and their mean. Datasets with one run are
    left out."""
    by_ds: dict[str, list[tuple[str, Summary]]] = {}
    for label, s in items:
        by_ds.setdefault(s.dataset, []).append((label, s))
    out = {}
    for ds, runs in by_ds.items():
        if len(runs) < 2:
            continue
        names = list(dict.fromkeys(n for _, s in runs for n in s.class_names))
        col = {n: i for i, n in enumerate(names)}
        members = np.zeros((len(runs), len(names)), dtype=bool)
        for i, (_, s) in enumerate(runs):
            members[i, [col[s.class_names[c]] for c in s.groups.hard]] = True
        jm = jaccard_matrix(members)
        pairs = [{"a": runs[a][0], "b": runs[b][0], "jaccard": float(jm[a, b]) if np.isfinite(jm[a, b]) else None}
                 for a, b in zip(*np.triu_indices(len(runs), 1))]
        j = mean_pairwise_jaccard(members)
        out[ds] = {"runs": [lab for lab, _ in runs], "pairs": pairs, "mean": j if np.isfinite(j) else None}
    return out


def cross_run(items: Sequence[tuple[str, Summary]]) -> pd.DataFrame:
    """Several runs as one frame, one row per (run, method): ``run`` (its label), ``setting`` (the table title),
    ``dataset``, ``encoder``, ``reference``, ``method``, then the run's :meth:`Summary.frame` columns."""
    frames = [s.frame().reset_index().assign(run=label, setting=s.title, dataset=s.dataset, encoder=s.encoder,
                                             reference=s.reference) for label, s in items]
    df = pd.concat(frames, ignore_index=True)
    first = ["run", "setting", "dataset", "encoder", "reference", "method"]
    return df[first + [c for c in df.columns if c not in first]]


def over_runs(df: pd.DataFrame) -> pd.DataFrame:
    """Per method, over the runs where it is not the reference (``df`` from :func:`cross_run`): ``runs``, the mean
    and sample SD over runs (``_sd``) of each run's seed-mean ΔHard, ΔEasy, ΔAll, and with CIs the number of runs
    whose ΔHard 95% CI lies above 0 (``ΔHard CI > 0``) and below 0 (``ΔHard CI < 0``). Index ``method``."""
    d = df[df["method"] != df["reference"]]
    g = d.groupby("method", sort=False)
    out = g[DELTA_COLUMNS].mean().join(g[DELTA_COLUMNS].std(ddof=1).add_suffix("_sd"))
    out.insert(0, "runs", g.size())
    if "ΔHard_ci_lo" in d:
        out["ΔHard CI > 0"] = (d["ΔHard_ci_lo"] > 0).groupby(d["method"], sort=False).sum()
        out["ΔHard CI < 0"] = (d["ΔHard_ci_hi"] < 0).groupby(d["method"], sort=False).sum()
    return out


def _jsonable(v: np.ndarray) -> list[float | None]:
    """A float list with NaN/Inf as None."""
    return [float(x) if np.isfinite(x) else None for x in np.asarray(v, dtype=float)]


def sample_sd(v: np.ndarray) -> float:
    """Sample standard deviation (ddof = 1) of the finite values; NaN with fewer than two."""
    v = v[np.isfinite(v)]
    return float(np.std(v, ddof=1)) if len(v) > 1 else float("nan")
