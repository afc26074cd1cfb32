"""One inference rule for every number a table compares: a two-stage (hierarchical) standard error, Student t
quantiles, a p-value, an equivalence test (TOST), the minimum detectable effect and a verdict, with
Benjamini–Hochberg q-values over a family of comparisons.

A table's value of a method is a mean over R *replicates* (seeds, and seeds × episodes where a training profile
is drawn several times), every replicate scored on the same test images. Two sources of randomness move it: the
training of the replicates, and the sample of test images. For a difference to the reference (replicate r of the
method paired with replicate r of the reference: d_r) or a level (d_r = the value itself):

* **Replicate stage.** Replicates of one episode share their training set, so they are averaged into G clusters
  first (one cluster per replicate when there are no episodes): c_g = mean of d_r over cluster g; the estimate is
  D = mean_r d_r. The between-cluster variance s² = Var_g(c_g) (ddof = 1) estimates the variance of a cluster
  mean *including* the part that comes from test images, so that part is subtracted (method of moments):
  σ²_train = max(s² − w, 0), with w = mean_b Var_g(c_g(b) − c_g) over the image bootstrap draws b
  (what the image noise alone adds to s²).
* **Image stage.** The 1000 shared, paired bootstrap draws of test images (every method, replicate and the
  reference on the same draws): V_img = Var_b(mean_g c_g(b)) (ddof = 1).
* **Together.** SE² = σ²_train / G + V_img; degrees of freedom by Welch–Satterthwaite,
  ν = SE⁴ / ((σ²_train / G)² / (G − 1)) (∞ when σ²_train = 0: the image stage is estimated from many images).
  Without test predictions V_img = w = 0 (only the replicate stage, ν = G − 1); with one cluster the training
  stage cannot be estimated and SE is the image stage alone (said so in ``Effect.note``).

From the one SE: CI = D ± t_{0.975, ν}·SE; p = 2·P(T_ν > |D| / SE); TOST at margin m:
p_equiv = max(P(T_ν > (D + m)/SE), P(T_ν > (m − D)/SE)) (equivalent when the 90% CI lies inside ±m);
MDE = (t_{0.975, ν} + t_{0.8, ν})·SE (the true effect found with 80% power at two-sided α = 0.05).
A verdict at q-level α: ``better`` / ``worse`` when q < α (by the sign, and whether higher is better), else
``equivalent`` when the BH-adjusted p_equiv < α, else ``inconclusive``.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

from .metrics import bh_qvalues

ALPHA = 0.05  # two-sided level of every CI, p and verdict (95% CIs)
POWER = 0.8  # the power of the minimum detectable effect
VERDICTS = ("better", "worse", "equivalent", "inconclusive")


@dataclass
class Effect:
    """One inferred quantity (points of %): estimate, its two-stage SE with the two stages' shares, ν, the 95% CI,
    p (H0: 0), p_equiv (TOST H0: |Δ| ≥ margin), the MDE; ``note`` says when a stage could not be estimated."""

    estimate: float
    se: float
    se_train: float
    se_image: float
    df: float
    ci: tuple[float, float]
    p: float
    p_equiv: float
    mde: float
    replicates: int
    clusters: int
    note: str = ""

    def as_dict(self) -> dict[str, float | int | str | list[float]]:
        d = asdict(self)
        d["ci"] = list(self.ci)
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def cluster_means(values: np.ndarray, clusters: np.ndarray) -> np.ndarray:
    """Mean over the last axis within each cluster id (sorted ids): [..., R] → [..., G]."""
    ids, inv = np.unique(clusters, return_inverse=True)
    onehot = np.zeros((len(clusters), len(ids)))
    onehot[np.arange(len(clusters)), inv] = 1.0
    return (values @ onehot) / onehot.sum(0)


def two_stage(d: np.ndarray, clusters: np.ndarray | None = None, draws: np.ndarray | None = None,
              margin: float = 1.0) -> Effect:
    """The rule of this module for per-replicate values ``d`` [R] (points), their cluster ids [R] (None: each
    replicate its own) and their image-bootstrap draws [B, R] (None: no test predictions)."""
    d = np.asarray(d, dtype=float)
    ok = np.isfinite(d)
    d = d[ok]
    r = len(d)
    clusters = np.arange(len(ok))[ok] if clusters is None else np.asarray(clusters)[ok]
    if r == 0:
        nan = float("nan")
        return Effect(nan, nan, nan, nan, nan, (nan, nan), nan, nan, nan, 0, 0, "no replicate")
    est = float(d.mean())
    c = cluster_means(d, clusters)
    g = len(c)
    v_img = w = 0.0
    if draws is not None:
        b = np.asarray(draws, dtype=float)[:, ok]
        b = b[np.isfinite(b).all(1)]
        if len(b) > 1:
            cb = cluster_means(b, clusters)  # [B, G]
            v_img = float(np.var(cb.mean(1), ddof=1))
            w = float(np.mean(np.var(cb - c, axis=1, ddof=1))) if g > 1 else 0.0
    note = ""
    if g > 1:
        var_train = max(float(np.var(c, ddof=1)) - w, 0.0) / g
    else:
        var_train = 0.0
        note = "one replicate cluster: training randomness not estimated"
        if draws is None:
            nan = float("nan")
            return Effect(est, nan, nan, nan, nan, (nan, nan), nan, nan, nan, r, g, note + ", no test predictions")
    var = var_train + v_img
    se = math.sqrt(var)
    df = var ** 2 / (var_train ** 2 / (g - 1)) if var_train > 0 else math.inf
    return _effect(est, se, math.sqrt(var_train), math.sqrt(v_img), df, margin, r, g, note)


def _effect(est: float, se: float, se_train: float, se_image: float, df: float, margin: float, r: int, g: int,
            note: str) -> Effect:
    t = stats.t(df) if math.isfinite(df) else stats.norm()
    q = float(t.ppf(1 - ALPHA / 2))
    if se > 0:
        p = float(2 * t.sf(abs(est) / se))
        p_equiv = float(max(t.sf((est + margin) / se), t.sf((margin - est) / se)))
    else:  # no variation at all (e.g. a method identical to the reference on every image and replicate)
        p = 1.0 if est == 0 else 0.0
        p_equiv = 0.0 if abs(est) < margin else 1.0
    mde = (q + float(t.ppf(POWER))) * se
    return Effect(est, se, se_train, se_image, df, (est - q * se, est + q * se), p, p_equiv, mde, r, g, note)


def label(estimate: np.ndarray, q: np.ndarray, q_equiv: np.ndarray, higher_is_better: bool = True,
          alpha: float = ALPHA) -> np.ndarray:
    """The verdicts of estimates with their q-values: ``better`` / ``worse`` where q < α (by the sign and
    ``higher_is_better``), else ``equivalent`` where q_equiv < α, else ``inconclusive`` (NaN q: not significant)."""
    est, q, q_equiv = (np.asarray(v, dtype=float) for v in (estimate, q, q_equiv))
    with np.errstate(invalid="ignore"):
        return np.where(q < alpha, np.where((est > 0) == higher_is_better, "better", "worse"),
                        np.where(q_equiv < alpha, "equivalent", "inconclusive"))


def verdicts(effects: list[Effect], higher_is_better: bool = True, alpha: float = ALPHA
             ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """BH q-values of p and of p_equiv over the family ``effects``, and each one's verdict (:func:`label`)."""
    q = bh_qvalues(np.array([e.p for e in effects], dtype=float))
    q_eq = bh_qvalues(np.array([e.p_equiv for e in effects], dtype=float))
    return q, q_eq, label([e.estimate for e in effects], q, q_eq, higher_is_better, alpha).tolist()


RULE = ("95% CIs, p and MDE from a two-stage SE: replicates (seeds; clustered by episode) with their test-image noise "
        "subtracted, plus 1000 shared, paired bootstraps of test images; Student t with Welch–Satterthwaite ν")
