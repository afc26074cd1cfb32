"""Calibration of the inference rule (mr2probe.inference) on tables simulated like the study's.

    OMP_NUM_THREADS=1 python benchmarks/calibration.py [--tables 10000] [--rule current|previous] [--out FILE.md]

Each simulated table holds a reference and its null control (the reference trained again on other seeds), R = S
seeds × E episodes replicates each, scored on the same test images of the hard group (⌊K/3⌋ classes, n per class;
the groups are fixed here, their ranking is tested in tests/test_inference.py). Image i carries a difficulty a_i
~ N(0, 1.5²) shared by every replicate and both methods; replicate r of a method is right on image i of class k
with probability Φ(1 + a_i + t_rk), where t_rk = τ·(√½·e_gk + √½·u_rk) (episode g's training set, shared by the
episode's seeds of both methods, and the seed's own part; t_rk = τ·u_rk without episodes), e, u ~ N(0, 1). τ is
set so that the training : image variance of a replicate's Δ (linearised, per cluster) is the regime's ratio.

Per table the rule gets what the tables give it: the cluster means of the replicates' Δ (points) and the image
noise of the paired bootstrap of test images, here its exact moments (B → ∞): Σ = Cov over images of the
per-image cluster Δs / n. Printed per regime (K, seeds × episodes, ratio):

* coverage: the share of null tables whose 95% CI of Δ holds 0 (target 94–96%; Monte-Carlo SE √(0.05·0.95/T):
  0.7 point at 1000 tables, 0.22 at 10,000);
* false equivalence: the share of tables with a true Δ at the equivalence margin m that the TOST calls
  equivalent (p_equiv < 0.05; target ≤ 5%, which a calibrated rule meets with equality); m = 2.5 × the SD of the
  null Δ over the regime's tables;
* FDR: Benjamini–Hochberg at q < 0.05 over families of 20 comparisons, 2 with a true Δ at the stated MDE and 18
  null (20,000 families, drawn in 10 disjoint blocks of the tables whose spread gives its Monte-Carlo SE), the
  mean share of discoveries that are null (target ≤ 5%; BH promises ≤ 0.05 · 18/20 = 4.5%);
* power: the share of tables with a true Δ at the stated MDE (root mean square over the null tables) found at
  p < 0.05 (the MDE's promise: 80%).

Each target is checked within 2 Monte-Carlo SEs (:data:`TOLERANCE`); the last line says whether all were met.

``--rule previous`` runs the rule before this one (training variance max(s² − w, 0), ν = ∞ when cut to 0),
``--rule welch`` this SE with a Welch–Satterthwaite ν that treats the shared image noise as known.
``--image-effect σ_b`` gives the compared method an effect of its own on every image, N(0, σ_b²) on the probit
scale, shared by its replicates (test-image noise that the replicates share, which their spread cannot show); the
CI is then checked against the method's population Δ.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats
from scipy.special import ndtr

from mr2probe.inference import ALPHA, POWER, image_moments, se_df
from mr2probe.metrics import bh_qvalues

MU, SIGMA_A, RHO_EPISODE = 1.0, 1.5, 0.5  # logit-free probit model: P(right) = Φ(MU + a_i + t_rk)
PER_CLASS = {10: 100, 100: 20}  # test images per class
RATIOS = (0.25, 1.0, 4.0)
DESIGNS = ((3, 1), (10, 1), (3, 5), (10, 5))  # seeds × episodes
FAMILY, TRUE_SHARE, FAMILIES = 20, 0.1, 20_000
TOLERANCE = 2.0  # Monte-Carlo standard errors a figure may lie beyond its target


@dataclass(frozen=True)
class Regime:
    k: int
    seeds: int
    episodes: int
    ratio: float

    @property
    def clusters(self) -> int:
        return self.episodes if self.episodes > 1 else self.seeds

    def name(self) -> str:
        return f"K={self.k}, {self.seeds} seeds × {self.episodes} ep, ratio {self.ratio:g}"


def tau(reg: Regime) -> float:
    """The training-noise scale τ at which Var_train(d) : Var_image(d) = ratio for one cluster's Δ (linearised):
    Var_train = 2·(1 − ρ_e)·A'²·τ²/H_k/S_g and Var_image = 2·(A(1 − A) − V_a)/n_H/S_g, with A = Φ(μ/√(1 + σ_a²))
    the mean accuracy, A' its slope in t, V_a = Var_a Φ(μ + a) the difficulty's share (a bivariate normal orthant)."""
    s = np.sqrt(1 + SIGMA_A ** 2)
    a = stats.norm.cdf(MU / s)
    slope = stats.norm.pdf(MU / s) / s
    rho = SIGMA_A ** 2 / (1 + SIGMA_A ** 2)
    both = stats.multivariate_normal([0, 0], [[1, rho], [rho, 1]]).cdf([MU / s, MU / s])
    hard_classes = reg.k // 3
    n_h = hard_classes * PER_CLASS[reg.k]
    image = 2 * (a * (1 - a) - (both - a * a)) / n_h
    shared = RHO_EPISODE if reg.episodes > 1 else 0.0
    return float(np.sqrt(reg.ratio * image * hard_classes / (2 * (1 - shared) * slope ** 2)))


def simulate(reg: Regime, tables: int, rng: np.random.Generator, chunk: int = 100, sigma_b: float = 0.0,
             keep: bool = False) -> dict[str, np.ndarray]:
    """Per table: the estimate D, s² of the cluster means, w, v_shared (points², from the exact bootstrap
    covariance of :func:`~mr2probe.inference.image_moments`); with ``keep`` also the cluster values ``c`` [T, G]
    and that covariance ``cov`` [T, G, G]."""
    hk, per = reg.k // 3, PER_CLASS[reg.k]
    n, r, g = hk * per, reg.seeds * reg.episodes, reg.clusters
    cls = np.repeat(np.arange(hk), per)
    member = np.arange(r) // reg.seeds if reg.episodes > 1 else np.arange(r)  # cluster of each replicate
    scale = tau(reg)
    out: dict[str, list[np.ndarray]] = {k: [] for k in ("est", "s2", "w", "shared", "c", "cov")}
    for start in range(0, tables, chunk):
        t = min(chunk, tables - start)
        a = rng.normal(0.0, SIGMA_A, (t, 1, n))
        episode = rng.standard_normal((t, reg.episodes, hk))[:, member if reg.episodes > 1 else np.zeros(r, int)]
        right = []
        for m in range(2):  # the reference, then its null control: the same episodes, their own seeds
            own = rng.standard_normal((t, r, hk))
            train = scale * (np.sqrt(RHO_EPISODE) * episode + np.sqrt(1 - RHO_EPISODE) * own
                             if reg.episodes > 1 else own)
            b = rng.normal(0.0, sigma_b, (t, 1, n)) if m and sigma_b else 0.0
            right.append(rng.random((t, r, n)) < ndtr(MU + a + b + train[:, :, cls]))
        d = 100.0 * (right[1].astype(np.float32) - right[0])  # [t, R, n], points
        dc = d.reshape(t, g, r // g, n).mean(2) if reg.episodes > 1 else d  # per-image cluster Δ [t, G, n]
        c = dc.mean(2)  # cluster values [t, G]
        x = dc - c[:, :, None]
        cov = np.einsum("tgn,thn->tgh", x, x, dtype=np.float64) / n ** 2  # exact bootstrap covariance
        _, w, shared = image_moments(cov)
        out["est"].append(c.mean(1))
        out["s2"].append(c.var(1, ddof=1))
        out["w"].append(w)
        out["shared"].append(shared)
        if keep:
            out["c"].append(c.astype(np.float64))
            out["cov"].append(cov)
    return {k: np.concatenate(v) for k, v in out.items() if v}


def current_rule(sim: dict[str, np.ndarray], g: int) -> tuple[np.ndarray, np.ndarray]:
    """(SE, ν) of mr2probe.inference."""
    se, df, _ = se_df(sim["s2"], sim["w"], sim["shared"], g)
    return se, df


def welch_rule(sim: dict[str, np.ndarray], g: int) -> tuple[np.ndarray, np.ndarray]:
    """(SE, ν) with the current SE and a Welch–Satterthwaite ν that treats v_shared as known:
    ν = SE⁴ / ((s²/G)²/(G − 1))."""
    se, _, _ = se_df(sim["s2"], sim["w"], sim["shared"], g)
    rep = sim["s2"] / g
    with np.errstate(divide="ignore", invalid="ignore"):
        return se, np.where(rep > 0, se ** 4 / (rep ** 2 / (g - 1)), g - 1.0)


def previous_rule(sim: dict[str, np.ndarray], g: int) -> tuple[np.ndarray, np.ndarray]:
    """(SE, ν) of the rule before: SE² = max(s² − w, 0)/G + V_img, ν from the training part alone, ∞ when it is
    cut to 0 (V_img = v_shared + w/G)."""
    train = np.maximum(sim["s2"] - sim["w"], 0.0) / g
    var = train + sim["shared"] + sim["w"] / g
    with np.errstate(divide="ignore", invalid="ignore"):
        df = np.where(train > 0, var ** 2 / (train ** 2 / (g - 1)), np.inf)
    return np.sqrt(np.maximum(var, 0.0)), df


RULES = {"current": current_rule, "welch": welch_rule, "previous": previous_rule}


def true_delta(reg: Regime, sigma_b: float) -> float:
    """The population Δ (points) of a method whose images carry an extra N(0, σ_b²) effect: the mean accuracy
    Φ(μ/√(1 + σ_a² + σ_b² + τ²)) minus the reference's Φ(μ/√(1 + σ_a² + τ²)) (0 for the null control)."""
    def acc(extra: float) -> float:
        return float(stats.norm.cdf(MU / np.sqrt(1 + SIGMA_A ** 2 + extra + tau(reg) ** 2)))
    return 100.0 * (acc(sigma_b ** 2) - acc(0.0))


def measure(reg: Regime, tables: int, seed: int = 0, rule: str = "current", sigma_b: float = 0.0
            ) -> dict[str, float]:
    """The four figures of one regime (fractions) from ``tables`` simulated tables with no effect (the null
    control, or with ``sigma_b`` a method whose images carry their own effect, centred on its population Δ)."""
    rng = np.random.default_rng([seed, reg.k, reg.seeds, reg.episodes, int(100 * reg.ratio), int(100 * sigma_b)])
    sim = simulate(reg, tables, rng, sigma_b=sigma_b)
    se, df = RULES[rule](sim, reg.clusters)
    dist = stats.t(np.where(np.isfinite(df), df, 1.0))
    crit = np.where(np.isfinite(df), dist.ppf(1 - ALPHA / 2), stats.norm.ppf(1 - ALPHA / 2))
    one = np.where(np.isfinite(df), dist.ppf(1 - ALPHA), stats.norm.ppf(1 - ALPHA))
    est = sim["est"] - true_delta(reg, sigma_b)
    cover = np.abs(est) <= crit * se
    margin = 2.5 * est.std(ddof=1)
    false_eq = margin - np.abs(est + margin) > one * se  # TOST at ±m equivalent while the true Δ is m
    mde = (crit + np.where(np.isfinite(df), dist.ppf(POWER), stats.norm.ppf(POWER))) * se
    shift = float(np.sqrt(np.mean(mde ** 2)))

    def p_of(x: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return 2 * np.where(np.isfinite(df), dist.sf(np.abs(x) / se), stats.norm.sf(np.abs(x) / se))

    p_null, p_true = p_of(est), p_of(est + shift)
    fdr = bh_fdr(p_null, p_true, np.random.default_rng(seed + 1))
    n = len(est)
    return {"coverage": float(cover.mean()), "false_equivalence": float(false_eq.mean()), "fdr": fdr[0],
            "fdr_se": fdr[1], "power_at_mde": float(np.mean(p_true < ALPHA)), "nu_median": float(np.median(df)),
            "tables": n, "coverage_se": float(np.sqrt(cover.mean() * (1 - cover.mean()) / n)),
            "false_equivalence_se": float(np.sqrt(false_eq.mean() * (1 - false_eq.mean()) / n))}


def bh_fdr(p_null: np.ndarray, p_true: np.ndarray, rng: np.random.Generator, blocks: int = 10
           ) -> tuple[float, float]:
    """The false-discovery rate of Benjamini–Hochberg at q < α over families of :data:`FAMILY` comparisons, a
    share :data:`TRUE_SHARE` with a true effect (p from ``p_true``) and the rest null (``p_null``): the mean over
    families of #null discoveries / max(#discoveries, 1), and its Monte-Carlo SE from ``blocks`` disjoint blocks of
    tables (each block's families drawn from its own tables)."""
    n_true = int(FAMILY * TRUE_SHARE)
    per_block = []
    for idx in np.array_split(rng.permutation(len(p_null)), blocks):
        draw = rng.choice(idx, (FAMILIES // blocks, FAMILY))
        picks = np.concatenate([p_true[draw[:, :n_true]], p_null[draw[:, n_true:]]], axis=1)
        found = np.apply_along_axis(bh_qvalues, 1, picks) < ALPHA
        per_block.append(np.mean(found[:, n_true:].sum(1) / np.maximum(found.sum(1), 1)))
    return float(np.mean(per_block)), float(np.std(per_block, ddof=1) / np.sqrt(blocks))


def regimes() -> list[Regime]:
    return [Regime(k, s, e, ratio) for k in PER_CLASS for s, e in DESIGNS for ratio in RATIOS]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", type=int, default=10_000, help="simulated tables per regime (≥ 1000)")
    ap.add_argument("--rule", choices=sorted(RULES), default="current")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--image-effect", type=float, default=0.0,
                    help="σ_b: the compared method's images carry their own N(0, σ_b²) effect (probit scale), shared "
                         "by its replicates (0: the null control)")
    ap.add_argument("--out", type=Path, default=None, help="also write the table (markdown) here")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows, ok = [], True
    for reg in regimes():
        m = measure(reg, args.tables, args.seed, args.rule, args.image_effect)
        ok &= (abs(m["coverage"] - 0.95) <= 0.01 + TOLERANCE * m["coverage_se"]
               and m["false_equivalence"] <= ALPHA + TOLERANCE * m["false_equivalence_se"]
               and m["fdr"] <= ALPHA + TOLERANCE * m["fdr_se"])
        rows.append({"K": reg.k, "seeds × episodes": f"{reg.seeds} × {reg.episodes}", "clusters": reg.clusters,
                     "train : image": reg.ratio, "coverage %": 100 * m["coverage"],
                     "false equiv. %": 100 * m["false_equivalence"], "BH FDR %": 100 * m["fdr"],
                     "FDR MC SE": 100 * m["fdr_se"], "power at MDE %": 100 * m["power_at_mde"],
                     "median ν": m["nu_median"]})
        print(rows[-1], flush=True)
    df = pd.DataFrame(rows)
    text = df.to_markdown(index=False, floatfmt=".2f")
    se = 100 * np.sqrt(0.05 * 0.95 / args.tables)
    what = f"σ_b = {args.image_effect:g}, " if args.image_effect else ""
    summary = (f"rule {args.rule}, {what}{args.tables} tables per regime (Monte-Carlo SE of a 95% coverage "
               f"{se:.2f} point): coverage {df['coverage %'].min():.1f}–{df['coverage %'].max():.1f}%, false "
               f"equivalence ≤ {df['false equiv. %'].max():.1f}%, BH FDR ≤ {df['BH FDR %'].max():.1f}%, power at "
               f"the stated MDE {df['power at MDE %'].min():.1f}–{df['power at MDE %'].max():.1f}%; targets "
               f"(coverage 94–96%, false equivalence ≤ 5%, FDR ≤ 5%, each within {TOLERANCE:g} Monte-Carlo SE) "
               f"{'met' if ok else 'NOT met'}; {time.perf_counter() - t0:.0f} s")
    print(text)
    print(summary)
    if args.out:
        args.out.write_text(text + "\n\n" + summary + "\n")


if __name__ == "__main__":
    main()
