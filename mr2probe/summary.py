"""The results' table model: one run's results.json (+ test predictions) → :class:`Summary`, the protocol's
columns per method (mean and sample SD over seeds, Δ to the reference paired by seed, bootstrap CIs of the seed
means) with the class groups and how they were ranked, and the per-class instruments from the test predictions
(precision and prediction rate, the hard classes' top confusions, per-class paired tests with BH q-values, the
minimum detectable ΔHard, the stability of the hard set over seeds). Below the writers (report, plots, bench),
which only render a Summary."""
from __future__ import annotations

import json
import math
from fractions import Fraction
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from .errors import UserError
from .inference import RULE, VERDICTS, Effect, two_stage, verdicts
from .inference import label as verdict_label
from .metrics import (COLUMNS, DELTA_COLUMNS, DELTA_OF, INSTRUMENT_COLUMNS, SIG_COLUMN, Bootstrap, Fold, Groups,
                      bh_qvalues, boundary_tie, class_groups, confusion, disparity_row, hard_instruments,
                      jaccard_matrix, mean_pairwise_jaccard, null_name, per_class_accuracy, per_class_paired_test,
                      precision_per_class, prediction_rate, stratified_halves)
from .profiles import parse_profile
from .results import Budget, RunRecord, RunResults
from .settings import EXACT_PROBE, EXACT_PROBE_TOLERANCE, GROUPS_ON, REPORT

LOWER_IS_BETTER = frozenset({"Std", "Gap", "ΔGap"})
EXTRA_COLUMNS = ["Top5", "BalancedAcc"]  # per replicate, over all of test: :func:`extra_columns`
HIGHER_IS_BETTER = frozenset(set(COLUMNS + DELTA_COLUMNS + EXTRA_COLUMNS) - LOWER_IS_BETTER) | {"HardPrec"}
CI_NAMES = ["All", "Hard"] + DELTA_COLUMNS  # the columns with a CI (``Summary.ci``, :mod:`~mr2probe.inference`)
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
    "mde": "MDE = (t_0.975,ν + t_0.8,ν) × SE(ΔHard), SE and ν of the two-stage rule (mr2probe.inference), per "
           "method; the table's value is the null control's",
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
    head: str = "?"  # the probe head (results.json's head)
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
    inference: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # method → column → effect
    margin: float = 1.0  # the equivalence margin (points)
    loo_groups: bool = False  # each replicate pair scored with groups ranked without it
    identical: dict[str, bool] = field(default_factory=dict)  # method → every replicate predicts as the reference
    manipulation: dict[str, dict[str, float]] = field(default_factory=dict)  # MR2 family: margin_spread, premise_r
    notes: list[str] = field(default_factory=list)  # warnings about the groups (ties, small val classes)

    def verdict(self, method: str, col: str = "ΔHard") -> str | None:
        """better / worse / equivalent / inconclusive of a Δ column, None for the reference or without one."""
        return self.inference.get(method, {}).get(col, {}).get("verdict")

    def verdict_text(self, method: str, col: str = "ΔHard") -> str:
        """The verdict as the tables print it: "equivalent within ±B" (B the equivalence bound, the smallest
        margin at which the TOST says equivalent), else the verdict word ("" without one)."""
        v = self.verdict(method, col) or ""
        bound = self.inference.get(method, {}).get(col, {}).get("equiv_bound")
        return f"{v} within ±{bound:.2f}" if v == "equivalent" and bound is not None else v

    def q(self, method: str, col: str = "ΔHard") -> float | None:
        return self.inference.get(method, {}).get(col, {}).get("q")

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
                "ci": RULE, "equivalence_margin": self.margin, "inference": self.inference,
                "mean": self.mean, "std": self.std, "ci_values": self.ci, "seeds": self.seeds,
                "minimum_detectable_delta_hard": self.mde, "hard_set_stability_seeds": self.seed_stability,
                "grid_edges": self.grid_edges, "reference_check": self.reference_check,
                "instruments": self.instruments_dict()}

    def extra_columns(self) -> list[str]:
        """The columns of :data:`EXTRA_COLUMNS` that some method has (Top5: not for runs made before it was
        stored)."""
        return [c for c in EXTRA_COLUMNS if any(c in self.mean[m] for m in self.methods)]

    def numeric_columns(self) -> list[str]:
        """The mean ± SD columns: the protocol's, the Δs, and the instruments this run has (HardPrec, HardRate)."""
        return COLUMNS + DELTA_COLUMNS + [c for c in self.instrument_columns() if c != SIG_COLUMN]

    def frame(self) -> pd.DataFrame:
        """The table as numbers, one row per method (index ``method``): every column's seed mean (%), then
        ``<col>_sd`` (sample SD; NaN for one seed), ``seeds``, ``groups_on``, with the per-class test ``Sig↑`` /
        ``Sig↓`` (counts; empty for the reference), with CIs ``<col>_ci_lo`` / ``_hi``; last (after the
        columns of earlier versions) ``Top5`` / ``BalancedAcc`` and their ``_sd`` (:meth:`extra_columns`). A method
        without test predictions has NaN instrument cells. Every writer (CSV, the markdown/LaTeX/HTML tables, the
        cross-run summary, ``mr2probe.summarize``) starts from this frame."""
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
        for c in DELTA_COLUMNS:
            for key in ("p", "q", "equiv_bound") + (("se", "se_train", "se_image", "df", "mde", "p_equiv", "q_equiv",
                                                     "resolution", "clusters") if c == "ΔHard" else ()):
                df[f"{c}_{key}"] = [_num(self.inference.get(m, {}).get(c, {}).get(key)) for m in self.methods]
            df[f"{c}_verdict"] = [self.verdict(m, c) or "" for m in self.methods]
        df["ΔHard_resolves"] = [self.inference.get(m, {}).get("ΔHard", {}).get("resolves") for m in self.methods]
        df["identical"] = [self.identical.get(m, False) for m in self.methods]
        for key in ("margin_spread", "premise_r"):
            df[key] = [self.manipulation.get(m, {}).get(key, np.nan) for m in self.methods]
        for c in self.extra_columns():  # last, after every column of earlier tables: Top5, BalancedAcc and SDs
            df[c] = [self.mean[m].get(c, np.nan) for m in self.methods]
            df[f"{c}_sd"] = [self.std[m].get(c, np.nan) for m in self.methods]
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
                f"{self.group_on} ({GROUPS_ON[self.group_on]}){null}; {RULE}; q: Benjamini–Hochberg over the "
                f"table's methods; verdict of ΔHard at q < 0.05, equivalence by TOST at ±{self.margin:g} points "
                "where the table resolves that margin (its MDE, the larger of the method's and the null control's, "
                "≤ the margin; else underpowered, and with one replicate cluster), identical where every "
                "replicate predicts as the reference")


def best_of(values: dict[str, float], col: str) -> set[str]:
    """Keys whose value, rounded to the 2 displayed decimals, is the column's best (ties all returned)."""
    shown = {m: float(f"{v:.2f}") for m, v in values.items() if np.isfinite(v)}
    if len(shown) < 2 or col not in HIGHER_IS_BETTER | LOWER_IS_BETTER:
        return set()
    target = (min if col in LOWER_IS_BETTER else max)(shown.values())
    return {m for m, v in shown.items() if v == target}


def extra_columns(runs: list[RunRecord]) -> dict[str, np.ndarray]:
    """Per replicate (%), over the whole test set: ``BalancedAcc`` = mean_k acc_k over the classes with test
    images (mean per-class recall, sklearn's ``balanced_accuracy_score``), and, where some replicate stored it,
    ``Top5`` = share of test images whose class is among the head's 5 largest logits (NaN for a replicate
    without it: knn, results made before it was stored)."""
    acc = np.array([r.per_class_acc for r in runs], dtype=float)
    out = {"BalancedAcc": 100 * np.nanmean(acc, axis=1)}
    top5 = np.array([np.nan if r.test_top5_acc is None else r.test_top5_acc for r in runs], dtype=float)
    return out | ({"Top5": 100 * top5} if np.isfinite(top5).any() else {})


def _replicate_clusters(runs: list[RunRecord]) -> np.ndarray:
    """Cluster id of each replicate: its episode when the runs span several episodes (replicates of one episode
    share their training set), else its own index (seeds are independent draws)."""
    episodes = np.array([r.episode for r in runs])
    return episodes if len(np.unique(episodes)) > 1 else np.arange(len(runs))


def episode_specific_classes(results: RunResults) -> bool:
    """Whether the episodes' training sets differ in their class counts (a long-tailed profile draws which classes
    are rare per episode): then which classes are hard changes with the episode."""
    counts = {tuple(e.get("train_class_counts") or ()) for e in results.episodes or []}
    return len(counts) > 1


def _ranking_pools(ref_runs: list[RunRecord], per_episode: bool) -> list[np.ndarray] | None:
    """For replicate pair i, the reference replicates its groups are ranked on (leave one out): those outside its
    cluster (:func:`_replicate_clusters`; other episodes where there are several); where the class counts are
    episode-specific (``per_episode``), the other seeds of its own episode (its own replicate where the episode
    has one seed: then the ranking carries that replicate's val noise, as ``val-pooled`` does). None: one cluster
    and no episode-specific classes, nothing to leave out."""
    index = np.arange(len(ref_runs))
    if per_episode:
        episodes = np.array([r.episode for r in ref_runs])
        same = [(episodes == e) & (index != i) for i, e in enumerate(episodes)]
        return [pool if pool.any() else index == i for i, pool in enumerate(same)]
    clusters = _replicate_clusters(ref_runs)
    if len(np.unique(clusters)) < 2:
        return None
    return [clusters != c for c in clusters]


def _folds(results: RunResults, ref_runs: list[RunRecord], y: np.ndarray | None,
           predictions: dict[str, np.ndarray] | None, reference: str, group_on: str
           ) -> tuple[list[Fold], np.ndarray, list[list[Fold]]]:
    """The scored test rows and their groups as shown (pooled over the reference's replicates), the ranking
    accuracy shown, and the folds that score each replicate pair: under ``val`` the groups of pair i are ranked on
    the reference's replicates of :func:`_ranking_pools` (leave one out); otherwise the shown ones."""
    k = len(results.class_names)
    n_test = int(np.sum(results.test_class_counts))
    everything = np.arange(n_test)
    if group_on in ("val", "val-pooled", "test"):
        key = "per_class_acc" if group_on == "test" else "val_per_class_acc"
        if any(getattr(r, key) is None for r in ref_runs):
            raise UserError(f"the reference runs have no {key}; train again or use --groups-on test")
        accs = np.array([getattr(r, key) for r in ref_runs], dtype=float)
        rank = np.nanmean(accs, axis=0)
        tie = tiebreak_score(results)
        shown = [Fold(everything, class_groups(rank, tie))]
        pools = _ranking_pools(ref_runs, episode_specific_classes(results)) if group_on == "val" else None
        if pools is None:  # nothing left out: every pair scored with the groups shown
            return shown, rank, [shown] * len(ref_runs)
        loo = [[Fold(everything, class_groups(np.nanmean(accs[pool], axis=0), tie))] for pool in pools]
        return shown, rank, loo
    if y is None or any(f"{reference}/{r.seed}" not in predictions for r in ref_runs):
        raise UserError("--groups-on crossfit needs predictions.npz with the reference's test predictions")
    halves = stratified_halves(y, seed=0)
    folds, ranks = [], []
    for rank_rows, score_rows in (halves, halves[::-1]):
        rank = np.mean([per_class_accuracy(predictions[f"{reference}/{r.seed}"][rank_rows], y[rank_rows], k)
                        for r in ref_runs], axis=0)
        folds.append(Fold(score_rows, class_groups(rank)))
        ranks.append(rank)
    return folds, ranks[0], [folds] * len(ref_runs)


def tiebreak_score(results: RunResults) -> np.ndarray | None:
    """The second ranking key of the groups, for classes tied on the reference's accuracy: the mean val accuracy of
    every run of the table (all methods; results.json stores no val log-probabilities, so no finer score of the
    reference is available). None when no run has val accuracy."""
    val = [r.val_per_class_acc for r in results.runs if r.val_per_class_acc is not None]
    return np.nanmean(np.array(val, dtype=float), axis=0) if val else None


SMALL_VAL_CLASS = 20  # [choice] a class with fewer val images than this ranks its group on too little
MAX_DENOMINATOR = 1_000_000  # a least common denominator of val accuracies above this is no count


def val_class_sizes(results: RunResults) -> np.ndarray:
    """Per class, how many val images there are, as far as results.json tells (it stores no val counts): the
    largest of (a) the least common denominator of the class's val accuracies over every run (a count that all of
    them are fractions of; a lower bound) and (b) the val split's size × the class's share of test (the split is
    stratified). NaN where neither is known (a common denominator past a million: accuracies that are not fractions
    of a small count tell nothing)."""
    k = len(results.class_names)
    common = [1] * k
    for r in results.runs:
        for i, a in enumerate(r.val_per_class_acc or []):
            if a is not None and np.isfinite(a) and common[i] <= MAX_DENOMINATOR:
                common[i] = math.lcm(common[i], Fraction(float(a)).limit_denominator(100_000).denominator)
    dens = np.array([c if c <= MAX_DENOMINATOR else np.nan for c in common], dtype=float)
    test = np.asarray(results.test_class_counts, dtype=float)
    n_val = results.val_size
    share = np.round(n_val * test / test.sum()) if n_val else np.full(k, np.nan)
    return np.fmax(dens, share) if n_val else dens


def group_notes(results: RunResults, rank: np.ndarray, group_on: str,
                ref_runs: list[RunRecord] | None = None) -> list[str]:
    """Notes about the groups: ranked per episode (:func:`episode_specific_classes`), with a warning where an
    episode has one replicate of the reference (``ref_runs``), whose pair is then ranked on its own val accuracy;
    a hard group decided by ties of the reference's ranking accuracy (and whether the second key,
    :func:`tiebreak_score`, separated them); classes with fewer than :data:`SMALL_VAL_CLASS` val images."""
    notes, names = [], list(results.class_names)
    if group_on == "val" and episode_specific_classes(results):
        notes.append("Groups per episode: the episodes make different classes rare, so each replicate pair's "
                     "hard classes are ranked on its own episode's other seeds (the groups shown pool every "
                     "episode)")
        per_episode = pd.Series([r.episode for r in ref_runs or []]).value_counts()
        if (per_episode == 1).any():
            notes.append(f"Warning: {int((per_episode == 1).sum())} of {len(per_episode)} episodes have one seed "
                         "of the reference, so their pairs' hard classes are ranked on that seed's own val "
                         "accuracy (nothing left out): its val noise biases ΔHard upwards, the null control's "
                         "too; train ≥ 2 seeds per episode")
    if group_on in ("val", "val-pooled", "test"):
        tied = boundary_tie(rank)
        if tied:
            tie = tiebreak_score(results) if group_on != "test" else None
            still = boundary_tie(rank, tie) if tie is not None else tied
            how = ("every run's mean val accuracy separated them" if not still else
                   f"{still} remain tied after every run's mean val accuracy, so class order decides"
                   if tie is not None else "class order decides")
            notes.append(f"Warning: the hard group is decided by ties: {tied} classes share the reference's "
                         f"{group_on} accuracy {100 * rank[np.argsort(rank, kind='stable')[len(rank) // 3 - 1]]:.2f} "
                         f"at its edge; {how} (results.json has no val log-probabilities to rank on)")
    sizes = val_class_sizes(results)
    small = [f"{names[i]} ({int(sizes[i])})" for i in np.flatnonzero(sizes < SMALL_VAL_CLASS)]
    if small and group_on in ("val", "val-pooled"):
        notes.append(f"Warning: fewer than {SMALL_VAL_CLASS} val images in {len(small)} class"
                     f"{'es' * (len(small) > 1)} (as far as results.json tells): {', '.join(small[:10])}"
                     f"{' …' if len(small) > 10 else ''}; their rank rests on few images")
    return notes


def manipulation_check(runs_by_method: dict[str, list[RunRecord]], rank: np.ndarray
                       ) -> dict[str, dict[str, float]]:
    """Per MR2-family method (``mr2``, ``mr2_*``) with per-run ``margins``: margin_spread = mean over replicates of
    γ_max / γ_min (1 = no class-dependent margin: MR2 reduces to a uniform margin); premise_r = Spearman r between
    the class variability v_k (mean over replicates of ``variability``) and the reference's per-class ranking
    accuracy (the paper's premise, hard classes vary more, reads r < 0)."""
    out = {}
    for m, runs in runs_by_method.items():
        if not (m == "mr2" or m.startswith("mr2_")) or not all(r.margins is not None for r in runs):
            continue
        g = np.array([r.margins for r in runs], dtype=float)
        row = {"margin_spread": float(np.mean(g.max(1) / g.min(1)))}
        if all(r.variability is not None for r in runs):
            v = np.mean([r.variability for r in runs], axis=0)
            constant = np.ptp(v) == 0 or np.ptp(rank) == 0  # no ranking to correlate
            row["premise_r"] = float("nan") if constant else float(spearmanr(v, rank).statistic)
        out[m] = row
    return out


def manipulation_line(check: dict[str, dict[str, float]], reference: str, group_on: str) -> str | None:
    """The line under a table with an MR2-family method: each one's margin spread and premise r."""
    if not check:
        return None
    parts = [f"{m}: γ_max/γ_min {c['margin_spread']:.3f}" + (f", premise r_s(v_k, {reference} {group_on} accuracy) "
                                                           f"{c['premise_r']:+.2f}"
                                                           if np.isfinite(c.get("premise_r", np.nan)) else "")
             for m, c in check.items()]
    return ("MR2 manipulation check (margin spread: mean over replicates of γ_max/γ_min, 1 = uniform margins; "
            "premise: Spearman r between class variability v_k and the reference's accuracy, < 0 when hard classes "
            f"vary more): {'; '.join(parts)}")


INFERRED = ["All", "Hard"] + DELTA_COLUMNS  # the columns inferred by :func:`~mr2probe.inference.two_stage`


@dataclass
class _Scoring:
    """How summarize scores a replicate: the test labels ``y`` and ``predictions`` (None without them), the folds
    shown and each replicate pair's folds, the test class counts."""

    y: np.ndarray | None
    predictions: dict[str, np.ndarray] | None
    folds: list[Fold]
    pair_folds: list[list[Fold]]
    counts: np.ndarray
    k: int

    def __post_init__(self) -> None:
        y, k = self.y, self.k
        self.fold_counts = [np.bincount(y[f.rows], minlength=k).astype(float) for f in self.folds] \
            if y is not None else [self.counts]
        self.boot = Bootstrap(y, self.folds, k) if y is not None else None

    def fold_list(self, i: int) -> list[Fold]:
        return self.pair_folds[i] if i < len(self.pair_folds) else self.folds

    def row(self, run: RunRecord, i: int) -> dict[str, float]:
        """The protocol's columns for replicate i, averaged over its folds (from predictions where a fold is a
        part of test)."""
        fl = self.fold_list(i)
        if len(fl) == 1:
            return disparity_row(np.asarray(run.per_class_acc, dtype=float), fl[0].groups, self.counts)
        pred = (self.predictions or {}).get(run.key)
        if pred is None:
            raise UserError(f"--groups-on crossfit needs the test predictions of every run; predictions.npz has "
                            f"none for {run.key}")
        rows = [disparity_row(per_class_accuracy(pred[f.rows], self.y[f.rows], self.k), f.groups, c)
                for f, c in zip(fl, self.fold_counts)]
        return {c: float(np.mean([r[c] for r in rows])) for c in rows[0]}

    def have_preds(self, runs: list[RunRecord]) -> bool:
        return self.y is not None and all(r.key in self.predictions for r in runs)

    def draws(self, runs: list[RunRecord]) -> dict[str, np.ndarray] | None:
        """Per column the image-bootstrap draws of every replicate, [B, R] (points), or None without predictions."""
        if self.boot is None or not self.have_preds(runs):
            return None
        return self.boot.rows([self.predictions[r.key] for r in runs], self.y,
                              [[f.groups for f in self.fold_list(i)] for i in range(len(runs))])


def _title(results: RunResults) -> str:
    """The table's title: encoder, dataset, head, adapter and a training profile other than the full set."""
    title = f"{results.encoder} on {results.dataset}, {results.head} head, adapter {results.adapter}"
    profile = results.profile
    if profile["kind"] != "full":
        title += f", train: {described(profile)}"
    return title


def described(profile: dict[str, Any]) -> str:
    """A recorded profile in today's words (:meth:`Profile.describe`, which names a long tail's class orders),
    so tables rendered again say it for runs recorded before; the recorded text where it no longer parses."""
    try:
        return parse_profile(profile["text"], profile.get("episodes", 1), profile.get("seed", 0)).describe()
    except (KeyError, UserError):
        return str(profile.get("describe", profile.get("text")))


def summarize(results: RunResults | dict[str, Any], predictions: dict[str, np.ndarray] | None = None,
              group_on: str = "val", null: bool = True, margin: float = REPORT["equivalence_margin"].default
              ) -> Summary:
    """Groups from the reference (``group_on``, :data:`GROUPS_ON`; under ``val`` each replicate pair is scored with
    groups ranked without it), then every column per method: mean and sample SD (ddof = 1) over replicates, Δ to
    the reference paired replicate by replicate (the i-th run of a method by seed with the reference's i-th), and
    for All, Hard and every Δ the two-stage inference of :mod:`~mr2probe.inference` (CI, p, TOST at ``margin``
    points, MDE), with Benjamini–Hochberg q-values and a verdict per Δ column over the table's methods (the null
    control its own family). ``null``: keep the null control's rows (the reference on disjoint seeds) when the run
    has them. With test predictions also the instruments (:data:`INSTRUMENTS_DEFINITIONS`): HardPrec / HardRate
    per seed like the other columns, per-class precision and prediction rate, the hard classes' top confusions,
    per-class paired tests against the reference with BH q-values; with or without them the hard-set stability over
    the reference's seeds (:func:`seed_stability`)."""
    REPORT["groups_on"].check_choice(group_on, "--groups-on")
    results = RunResults.coerce(results)
    by_method, reference = results.by_method(), results.reference
    if reference not in by_method:
        raise UserError(f"reference method {reference!r} is not among the runs ({', '.join(by_method)})")
    null_method = null_name(reference) if null_name(reference) in by_method else None
    if not null and null_method:
        del by_method[null_method]
        null_method = None
    ref_runs = by_method[reference]
    y = predictions.get("test_labels") if predictions else None
    k = len(results.class_names)
    folds, rank_acc, pair_folds = _folds(results, ref_runs, y, predictions, reference, group_on)
    sc = _Scoring(y, predictions, folds, pair_folds, np.asarray(results.test_class_counts, dtype=float), k)
    row, have_preds, draws = sc.row, sc.have_preds, sc.draws
    ref_rows = [row(r, i) for i, r in enumerate(ref_runs)]
    ref_draws = draws(ref_runs)
    ins = _Instruments(y, folds, k, list(results.class_names))
    if y is not None and have_preds(ref_runs):
        ins.ref_correct = np.array([predictions[r.key] == y for r in ref_runs])
    mean, std, ci, seeds, per_seed, accs, effects, identical = {}, {}, {}, {}, {}, {}, {}, {}
    for method, runs in by_method.items():
        accs[method] = np.array([r.per_class_acc for r in runs], dtype=float)
        rows = [row(r, i) for i, r in enumerate(runs)]
        cols = {c: np.array([rw[c] for rw in rows]) for c in COLUMNS} | extra_columns(runs)
        n = min(len(rows), len(ref_rows))
        for d, c in DELTA_OF.items():
            cols[d] = np.array([rw[c] - ref_rows[i][c] if i < n else np.nan for i, rw in enumerate(rows)])
        if have_preds(runs):
            preds = [predictions[r.key] for r in runs]
            cols.update(ins.add(method, preds, method != reference))
            if method != reference and have_preds(ref_runs) and len(runs) <= len(ref_runs):
                identical[method] = all(np.array_equal(p, predictions[ref_runs[i].key])
                                        for i, p in enumerate(preds))
        mean[method] = {c: float(np.nanmean(v)) for c, v in cols.items()}
        std[method] = {c: sample_sd(v) for c, v in cols.items()}
        seeds[method] = [r.seed for r in runs]
        per_seed[method] = cols
        clusters = _replicate_clusters(runs)
        mine = draws(runs) if method != reference else ref_draws
        effects[method] = {c: two_stage(cols[c], clusters, None if mine is None else mine[c], margin)
                           for c in ("All", "Hard")}
        if method != reference:
            for d, c in DELTA_OF.items():
                diff = None if mine is None or ref_draws is None else mine[c][:, :n] - ref_draws[c][:, :n]
                effects[method][d] = two_stage(cols[d][:n], clusters[:n], diff, margin)
        ci[method] = {c: [e.ci[0], e.ci[1]] for c, e in effects[method].items()}
    inference = _verdicts(effects, reference, null_method, margin, identical)
    check = manipulation_check(by_method, rank_acc)
    manipulation = manipulation_line(check, reference, group_on)
    notes = group_notes(results, rank_acc, group_on, ref_runs) + ([manipulation] if manipulation else [])
    title = _title(results)
    return Summary(list(by_method), reference, folds[0].groups, mean, std, ci, seeds, title, per_seed, accs,
                   rank_acc, list(results.class_names), group_on, folds, null_method,
                   dataset=results.dataset, encoder=results.encoder, head=str(results.head),
                   precision=ins.precision, pred_rate=ins.rate, share=ins.share, confusions=ins.confusions,
                   significance=ins.significance,
                   mde=detectable_delta_hard(inference, null_method),
                   seed_stability=seed_stability(ref_runs, list(results.class_names)),
                   grid_edges=grid_edges(by_method, {"k": sum(results.train_class_counts or [math.inf])}),
                   reference_check=reference_probe_check(mean, reference, results.budget, ref_runs,
                                                         by_method.get(EXACT_PROBE, [])),
                   inference=inference, margin=margin,
                   loo_groups=group_on == "val" and pair_folds[0] is not folds, identical=identical,
                   manipulation=check, notes=notes)


def _verdicts(effects: dict[str, dict[str, Effect]], reference: str, null: str | None, margin: float,
              identical: dict[str, bool]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per method and inferred column: the effect (:class:`~mr2probe.inference.Effect` as a dict) and, for the Δ
    columns, its BH q over the table's methods (the reference and the null control left out; the null control is
    a family of its own), q_equiv, the ``resolution`` its margin is compared with (the larger of its own MDE and
    the null control's: what this table can resolve), ``resolves`` (two or more clusters and resolution ≤
    ``margin``) and the verdict (:func:`~mr2probe.inference.verdicts`)."""
    out = {m: {c: e.as_dict() for c, e in cols.items()} for m, cols in effects.items()}
    for d in DELTA_COLUMNS:
        floor = effects[null][d].mde if null and d in effects[null] else float("nan")
        for family in ([m for m in effects if m not in (reference, null)], [null] if null else []):
            if not family:
                continue
            res = np.fmax([effects[m][d].mde for m in family], floor)
            same = [identical.get(m, False) for m in family]
            q, q_eq, verdict = verdicts([effects[m][d] for m in family], d in HIGHER_IS_BETTER, resolution=res,
                                        margin=margin, identical=same)
            for m, qi, qe, v, r in zip(family, q, q_eq, verdict, res):
                out[m][d].update(q=float(qi) if np.isfinite(qi) else None,
                                 q_equiv=float(qe) if np.isfinite(qe) else None, verdict=v,
                                 resolution=float(r) if np.isfinite(r) else None,
                                 resolves=bool(effects[m][d].clusters > 1 and not r > margin))
    return out


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


def detectable_delta_hard(inference: dict[str, dict[str, dict[str, Any]]], null: str | None
                          ) -> dict[str, Any] | None:
    """The table's minimum detectable ΔHard (points; 80% power, two-sided α = 0.05), from the same two-stage SE
    as every CI (:mod:`~mr2probe.inference`): MDE = (t_0.975,ν + t_0.8,ν)·SE. ``value`` is the null control's (what
    this cell can detect when nothing differs), else the median over the methods; ``per_method`` holds every
    method's own (a method far from the reference varies more, so its MDE is larger). None without any."""
    per = {m: cols["ΔHard"]["mde"] for m, cols in inference.items() if "ΔHard" in cols}
    per = {m: v for m, v in per.items() if v is not None and np.isfinite(v)}
    if not per:
        return None
    if null is not None and null in per:
        e = inference[null]["ΔHard"]
        value, source = per[null], "null control"
        describe = (f"the null control's: (t_0.975 + t_0.8) × SE, SE {e['se']:.2f} (replicates {e['se_train']:.2f}, "
                    f"test images {e['se_image']:.2f}), ν = {_nu(e['df'])}")
    else:
        value, source = float(np.median(list(per.values()))), "methods"
        describe = "no null control: the median over the methods' own MDEs"
    others = [v for m, v in per.items() if m != null]
    if others:
        describe += f"; the methods' own: {min(others):.2f}–{max(others):.2f}"
    return {"value": value, "source": source, "describe": describe, "per_method": per}


def _nu(df: float | None) -> str:
    return "∞" if df is None or not np.isfinite(df) else f"{df:.1f}"


def seed_stability(ref_runs: list[RunRecord], names: list[str]) -> dict[str, Any]:
    """Mean pairwise Jaccard of the reference's per-seed hard sets, each seed ranked on its own val accuracy
    (on test where the runs have no val accuracy); the per-seed hard sets too. value None with one seed."""
    key, on = ("val_per_class_acc", "val") if all(r.val_per_class_acc is not None for r in ref_runs) else \
        ("per_class_acc", "test")
    members = np.zeros((len(ref_runs), len(names)), dtype=bool)
    for i, r in enumerate(ref_runs):
        members[i, class_groups(np.asarray(getattr(r, key), dtype=float)).hard] = True
    j = mean_pairwise_jaccard(members)
    return {"value": j if np.isfinite(j) else None, "seeds": len(ref_runs),
            "pairs": len(ref_runs) * (len(ref_runs) - 1) // 2, "ranked_on": on,
            "hard_sets": {str(r.seed): [names[c] for c in np.flatnonzero(m)] for r, m in zip(ref_runs, members)}}


GRID_EDGE_MIN_VALUES = 3  # a grid of two values has no inside: every choice is at one of its ends
GRID_EDGE_RISE = 0.001  # [choice] val-score gain over the next value inwards (0.1 point) that counts as still rising


def grid_edges(runs_by_method: dict[str, list[RunRecord]], ceilings: dict[str, float] | None = None
               ) -> list[dict[str, Any]]:
    """Hyperparameters chosen at an end of their val grid (numeric grids of ≥ 3 values, from each run's ``grid``)
    where the val score was still rising there: the chosen point beats the same point with that hyperparameter
    one grid value inwards by more than :data:`GRID_EDGE_RISE`. A wider grid might do better; for the reference
    it means it may be under-fit. Only the hyperparameters the grid records are compared (a exact probe
    records fixed ones beside them); an upper end at its ``ceilings`` value (kNN's k at the number of training
    rows) cannot be widened and is not flagged. One row per (method, hyperparameter, end): the value, the grid's
    range, in how many of the method's runs (seeds × episodes) and the mean rise there (points)."""
    ceilings = ceilings or {}
    rows = []
    for method, runs in runs_by_method.items():
        hits: dict[tuple[Any, ...], list[float]] = {}
        for run in runs:
            entries = run.grid
            grid = [g["hparams"] for g in entries]
            score = {json.dumps(g["hparams"], sort_keys=True): g["val_score"] for g in entries}
            recorded = {k for h in grid for k in h}
            chosen = {k: v for k, v in run.hparams.items() if k in recorded}
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
                          budget: Budget | None = None, ref_runs: Sequence[RunRecord] = (),
                          probe_runs: Sequence[RunRecord] = ()) -> dict[str, Any] | None:
    """The reference against the exact logistic regression on the same features: gap = All(logreg) − All(reference)
    (seed means, points) and ``under_fit`` = gap > :data:`EXACT_PROBE_TOLERANCE` (a budget or grid too small for
    these features), with the run's step budget (``steps``; ``calibrated``/``reached`` under the reach-logreg
    rule). ``val_gap``: the same difference of the runs' val scores (what selection saw; None when a run has
    none). None without a ``logreg`` row, or when logreg is the reference."""
    if EXACT_PROBE not in mean or reference not in mean or reference == EXACT_PROBE:
        return None
    gap = mean[EXACT_PROBE]["All"] - mean[reference]["All"]
    scores = [[r.val_score for r in runs] for runs in (probe_runs, ref_runs)]
    val_gap = (100 * (np.mean(scores[0]) - np.mean(scores[1]))
               if all(v and all(_is_number(x) for x in v) for v in scores) else None)
    calibration = budget.calibration if budget else None
    chosen = sorted({int(r.checkpoint_step) for r in ref_runs if r.checkpoint_step is not None})
    return {"probe": EXACT_PROBE, "gap": gap, "tolerance": EXACT_PROBE_TOLERANCE,
            "under_fit": bool(gap > EXACT_PROBE_TOLERANCE), "val_gap": None if val_gap is None else float(val_gap),
            "steps": budget.steps if budget else None, "calibrated": calibration is not None,
            "reached": None if calibration is None else calibration["reached"],
            "checkpoints": budget.checkpoints if budget else None, "reference_checkpoints": chosen}


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
    ``dataset``, ``encoder``, ``reference``, ``method``, then the run's :meth:`Summary.frame` columns, and the
    ΔHard family over every run: ``ΔHard_q_all`` / ``ΔHard_verdict_all`` (:func:`family_verdicts`)."""
    frames = [s.frame().reset_index().assign(run=label, setting=s.title, dataset=s.dataset, encoder=s.encoder,
                                             reference=s.reference) for label, s in items]
    df = pd.concat(frames, ignore_index=True)
    first = ["run", "setting", "dataset", "encoder", "reference", "method"]
    return family_verdicts(df[first + [c for c in df.columns if c not in first]])


def is_comparison(df: pd.DataFrame) -> pd.Series:
    """Rows that compare a method with its run's reference: neither the reference nor its null control."""
    nulls = df["reference"].map(null_name)
    return (df["method"] != df["reference"]) & (df["method"] != nulls)


def family_verdicts(df: pd.DataFrame, col: str = "ΔHard", margin: float | None = None) -> pd.DataFrame:
    """BH over every comparison row of ``df`` (:func:`is_comparison`: every method × run) at once: ``<col>_q_all``
    and ``<col>_verdict_all`` (better / worse / equivalent / inconclusive, as in one table, from the rows' p and
    p_equiv). The null control rows keep their own q as their ``_all`` value. ``df`` from :func:`cross_run` (or
    several of them concatenated)."""
    df = df.copy()
    comp = is_comparison(df)
    q = bh_qvalues(df.loc[comp, f"{col}_p"].to_numpy(dtype=float))
    have_equiv = f"{col}_p_equiv" in df
    q_eq = bh_qvalues(df.loc[comp, f"{col}_p_equiv"].to_numpy(dtype=float)) if have_equiv else np.full(len(q), np.nan)
    rows = df.loc[comp]

    def flag(name: str, default: bool) -> np.ndarray | None:
        return rows[name].fillna(default).astype(bool).to_numpy() if name in rows else None

    single = rows[f"{col}_clusters"].to_numpy(dtype=float) < 2 if f"{col}_clusters" in rows else None
    verdict = verdict_label(rows[col].to_numpy(dtype=float), q, q_eq, col in HIGHER_IS_BETTER,
                            resolves=flag(f"{col}_resolves", True), identical=flag("identical", False), single=single)
    df[f"{col}_q_all"] = np.nan
    df[f"{col}_verdict_all"] = ""
    df.loc[comp, f"{col}_q_all"] = q
    df.loc[comp, f"{col}_verdict_all"] = verdict
    nulls = df["method"] == df["reference"].map(null_name)
    df.loc[nulls, f"{col}_q_all"] = df.loc[nulls, f"{col}_q"]
    df.loc[nulls, f"{col}_verdict_all"] = df.loc[nulls, f"{col}_verdict"]
    return df


def over_runs(df: pd.DataFrame) -> pd.DataFrame:
    """Per method, over the runs where it is not the reference (``df`` from :func:`cross_run`): ``runs``, the mean
    and sample SD over runs (``_sd``) of each run's seed-mean Δs, and how many runs give each ΔHard verdict of the
    whole family (``better``, ``worse``, ``equivalent``, ``inconclusive``: ``ΔHard_verdict_all``). Index
    ``method``."""
    d = df[df["method"] != df["reference"]]
    g = d.groupby("method", sort=False)
    out = g[DELTA_COLUMNS].mean().join(g[DELTA_COLUMNS].std(ddof=1).add_suffix("_sd"))
    out.insert(0, "runs", g.size())
    if "ΔHard_verdict_all" in d:
        for v in VERDICTS:
            out[v] = (d["ΔHard_verdict_all"] == v).groupby(d["method"], sort=False).sum()
    return out


def _num(v: Any) -> float:
    return float(v) if v is not None else float("nan")


def _jsonable(v: np.ndarray) -> list[float | None]:
    """A float list with NaN/Inf as None."""
    return [float(x) if np.isfinite(x) else None for x in np.asarray(v, dtype=float)]


def sample_sd(v: np.ndarray) -> float:
    """Sample standard deviation (ddof = 1) of the finite values; NaN with fewer than two."""
    v = v[np.isfinite(v)]
    return float(np.std(v, ddof=1)) if len(v) > 1 else float("nan")
