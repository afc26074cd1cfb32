"""One inference rule for every number a table compares: a two-stage (hierarchical) standard error, Student t
quantiles, a p-value, an equivalence test (TOST) with its equivalence bound, the minimum detectable effect and a
verdict, with Benjamini–Hochberg q-values over a family of comparisons.

A table's value of a method is a mean over R *replicates* (seeds, and seeds × episodes where a training profile
is drawn several times), every replicate scored on the same test images. Two sources of randomness move it: the
training of the replicates, and the sample of test images. For a difference to the reference (replicate r of the
method paired with replicate r of the reference: d_r) or a level (d_r = the value itself):

* **Replicate stage.** Replicates of one episode share their training set, so they are averaged into G clusters
  first (one cluster per replicate when there are no episodes): c_g = mean of d_r over cluster g; the estimate is
  D = mean_r d_r. The between-cluster variance s² = Var_g(c_g) (ddof = 1) holds the training noise *and* the part
  of the test-image noise that differs between clusters; it rests on G − 1 degrees of freedom.
* **Image stage.** The 1000 shared, paired bootstrap draws of test images (every method, replicate and the
  reference on the same draws) give the covariance of the cluster values over draws, Σ_gh = Cov_b(c_g(b), c_h(b)).
  Its mean off-diagonal entry v_shared = Σ_{g≠h} Σ_gh / (G(G − 1)) is the image noise the clusters *share*
  (the same test images favour every replicate alike), which s² cannot see. (V_img = Var_b(mean_g c_g(b)) =
  v_shared + w/G with w = mean_b Var_g(c_g(b) − c_g), the image noise that differs between clusters, already
  in s².)
* **Together.** SE² = s²/G + v_shared (= σ²_train/G + V_img with σ²_train = s² − w), kept ≥ s²/(2G) (v_shared
  is an estimate and can come out negative; where s² = 0, every cluster the same value, SE² = V_img);
  ν = G − 1: the SE rests on the spread of G cluster means, and nothing is subtracted from s², so ν is never ∞
  with G ≥ 2 (a Welch–Satterthwaite ν that treats v_shared as known grows exactly where s² came out small by
  chance; ``benchmarks/calibration.py`` measures both). The reported shares: se_train = √(max(s² − w, 0)/G),
  se_image = √(SE² − se_train²). Without test predictions v_shared = w = 0 (the t-interval of the cluster
  means); with one cluster the training stage cannot be estimated: SE = √V_img, ν = ∞ and the verdict is
  ``underpowered`` (``Effect.note`` says so).

From the one SE: CI = D ± t_{0.975, ν}·SE; p = 2·P(T_ν > |D| / SE); TOST at margin m:
p_equiv = max(P(T_ν > (D + m)/SE), P(T_ν > (m − D)/SE)) (equivalent when the 90% CI lies inside ±m); the
equivalence bound b = |D| + t_{0.95, ν}·SE is the smallest margin at which the TOST says equivalent;
MDE = (t_{0.975, ν} + t_{0.8, ν})·SE (the true effect found with 80% power at two-sided α = 0.05).
A verdict at q-level α (:func:`label`): ``identical`` where every replicate's predictions equal the reference's;
``underpowered`` with one replicate cluster; ``better`` / ``worse`` when q < α (by the sign, and whether higher is
better); else ``underpowered`` when the margin is below what the table resolves (its MDE: the larger of the
method's and the null control's); else ``equivalent`` when the BH-adjusted p_equiv < α, else ``inconclusive``.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

from .metrics import bh_qvalues

ALPHA = 0.05  # two-sided level of every CI, p and verdict (95% CIs)
POWER = 0.8  # the power of the minimum detectable effect
VERDICTS = ("better", "worse", "equivalent", "inconclusive", "underpowered", "identical")


@dataclass
class Effect:
    """One inferred quantity (points of %): estimate, its two-stage SE with the two stages' shares, ν, the 95% CI,
    p (H0: 0), p_equiv (TOST H0: |Δ| ≥ margin), the MDE, the equivalence bound |D| + t_{0.95,ν}·SE; ``note`` says
    when a stage could not be estimated."""

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
    equiv_bound: float = float("nan")

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


def image_moments(cov: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """From the draws' covariance of the G cluster values Σ [..., G, G]: (V_img, w, v_shared) with
    V_img = 1ᵀΣ1/G², w = (tr Σ − 1ᵀΣ1/G)/(G − 1) (the expected between-cluster variance the image noise adds) and
    v_shared = (1ᵀΣ1 − tr Σ)/(G(G − 1)) (mean off-diagonal entry) = V_img − w/G; w = v_shared = 0 for G = 1."""
    g = cov.shape[-1]
    total, trace = cov.sum((-2, -1)), np.trace(cov, axis1=-2, axis2=-1)
    if g < 2:
        return total, np.zeros_like(total), np.zeros_like(total)
    return total / g ** 2, (trace - total / g) / (g - 1), (total - trace) / (g * (g - 1))


def se_df(s2: np.ndarray, w: np.ndarray, v_shared: np.ndarray, g: int
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(SE, ν, se_train) of the rule for G ≥ 2 clusters (vectorised): SE² = max(s²/G + v_shared, s²/(2G)) (where
    s² = 0, every cluster the same value, the image stage alone: V_img = v_shared + w/G), ν = G − 1,
    se_train = √(max(s² − w, 0)/G)."""
    rep = np.asarray(s2, dtype=float) / g
    var = np.where(rep > 0, np.maximum(rep + v_shared, rep / 2), np.maximum(v_shared + np.asarray(w) / g, 0.0))
    return np.sqrt(var), np.full(np.shape(var), g - 1.0), np.sqrt(np.maximum(s2 - w, 0.0) / g)


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
    v_img = w = shared = 0.0
    if draws is not None:
        b = np.asarray(draws, dtype=float)[:, ok]
        b = b[np.isfinite(b).all(1)]
        if len(b) > 1:
            v_img, w, shared = (float(x) for x in image_moments(np.atleast_2d(np.cov(cluster_means(b, clusters),
                                                                                      rowvar=False))))
    if g < 2:
        note = "one replicate cluster: training randomness not estimated"
        if draws is None:
            nan = float("nan")
            return Effect(est, nan, nan, nan, nan, (nan, nan), nan, nan, nan, r, g, note + ", no test predictions")
        return _effect(est, math.sqrt(v_img), 0.0, math.sqrt(v_img), math.inf, margin, r, g, note)
    se, df, se_train = (float(x) for x in se_df(float(np.var(c, ddof=1)), w, shared, g))
    return _effect(est, se, se_train, math.sqrt(max(se ** 2 - se_train ** 2, 0.0)), df, margin, r, g, "")


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
    bound = abs(est) + float(t.ppf(1 - ALPHA)) * se
    return Effect(est, se, se_train, se_image, df, (est - q * se, est + q * se), p, p_equiv, mde, r, g, note, bound)


def label(estimate: np.ndarray, q: np.ndarray, q_equiv: np.ndarray, higher_is_better: bool = True,
          alpha: float = ALPHA, resolves: np.ndarray | None = None, identical: np.ndarray | None = None,
          single: np.ndarray | None = None) -> np.ndarray:
    """The verdicts of estimates with their q-values, first match: ``identical`` where ``identical`` (every
    replicate's predictions equal the reference's); ``underpowered`` where ``single`` (one replicate cluster);
    ``better`` / ``worse`` where q < α (by the sign and ``higher_is_better``); ``underpowered`` where not
    ``resolves`` (the margin is below the table's MDE); ``equivalent`` where q_equiv < α; else ``inconclusive``
    (NaN q: not significant). The three masks default to all False, all True, all False."""
    est, q, q_equiv = (np.asarray(v, dtype=float) for v in (estimate, q, q_equiv))
    n = est.shape
    resolves = np.ones(n, bool) if resolves is None else np.asarray(resolves, bool)
    identical = np.zeros(n, bool) if identical is None else np.asarray(identical, bool)
    single = np.zeros(n, bool) if single is None else np.asarray(single, bool)
    with np.errstate(invalid="ignore"):
        sig = np.where((est > 0) == higher_is_better, "better", "worse")
        rest = np.where(~resolves, "underpowered", np.where(q_equiv < alpha, "equivalent", "inconclusive"))
        v = np.where(q < alpha, sig, rest)
    return np.where(identical, "identical", np.where(single, "underpowered", v)).astype(object).astype(str)


def verdicts(effects: list[Effect], higher_is_better: bool = True, alpha: float = ALPHA,
             resolution: np.ndarray | None = None, margin: float | None = None,
             identical: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """BH q-values of p and of p_equiv over the family ``effects``, and each one's verdict (:func:`label`):
    ``resolution`` [n] the MDE each margin is compared with (None: each effect's own), ``margin`` the TOST's
    (None: no resolution check), ``identical`` [n] booleans."""
    q = bh_qvalues(np.array([e.p for e in effects], dtype=float))
    q_eq = bh_qvalues(np.array([e.p_equiv for e in effects], dtype=float))
    res = np.array([e.mde for e in effects], dtype=float) if resolution is None else np.asarray(resolution, float)
    with np.errstate(invalid="ignore"):
        resolves = None if margin is None else ~(res > margin)  # NaN MDE (no SE): nothing to compare
    single = np.array([e.clusters < 2 for e in effects])
    v = label([e.estimate for e in effects], q, q_eq, higher_is_better, alpha, resolves, identical, single)
    return q, q_eq, v.tolist()


RULE = ("95% CIs, p and MDE from a two-stage SE: the spread of replicate means (seeds; clustered by episode) plus "
        "the test-image noise they share, from 1000 shared, paired bootstraps of test images; Student t with "
        "ν = clusters − 1")
