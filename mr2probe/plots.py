"""Report plots as PNG files (matplotlib, Agg canvas; imported lazily so the CLI starts fast).

Every plot takes a :class:`~mr2probe.report.Summary` (per-seed per-class accuracies, groups, Δs) and writes one
PNG; no pyplot global state is used, so plotting is safe inside other programs.

    per_class.png    per-class test accuracy per method, classes sorted by the reference's accuracy
    groups.png       Easy / Medium / Hard / Worst per method, error bars = std over seeds
    variability.png  MR2 class variability v_k against reference accuracy, colour = margin γ_k, Spearman ρ
    tradeoff.png     ΔHard against ΔEasy per method (error bars = std over seeds of the paired differences)
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from .report import Summary

DPI = 120
GROUP_COLOURS = {"hard": "#f4cccc", "medium": "#fff2cc", "easy": "#d9ead3"}
MARKERS = "osD^vP*Xh<>"
MR2_FAMILY_FIRST = "mr2"


def _figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, format="png", dpi=DPI)
    return path


def method_colours(s: Summary) -> dict[str, Any]:
    """One colour per method, the same in every plot; the reference is near-black."""
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    others = [m for m in s.methods if m != s.reference]
    colours: dict[str, Any] = {m: cmap(i % 10) for i, m in enumerate(others)}
    colours[s.reference] = "0.15"
    return colours


def class_order(s: Summary) -> np.ndarray:
    """Classes sorted by the reference accuracy used for grouping (ascending, stable): hard first."""
    return np.argsort(s.rank_acc, kind="stable")


def plot_per_class(s: Summary, path: Path) -> Path:
    """Per-class accuracy (mean over seeds) of every method; hard / medium / easy regions shaded."""
    k = len(s.class_names)
    order = class_order(s)
    x = np.arange(k)
    fig = _figure(min(15.0, max(9.0, 0.4 * k + 3)), 5.2)
    ax = fig.add_subplot()
    n_hard, n_easy = len(s.groups.hard), len(s.groups.easy)
    for name, lo, hi in (("hard", 0, n_hard), ("medium", n_hard, k - n_easy), ("easy", k - n_easy, k)):
        if hi > lo:
            ax.axvspan(lo - 0.5, hi - 0.5, color=GROUP_COLOURS[name], zorder=0)
            ax.text((lo + hi - 1) / 2, 1.0, name, transform=ax.get_xaxis_transform(), ha="center", va="bottom",
                    fontsize=10, fontweight="bold", color="0.3")
    colours = method_colours(s)
    for i, m in enumerate(s.methods):
        mean = 100 * s.acc[m].mean(0)[order]
        ref = m == s.reference
        few = k <= 60  # markers and thick lines only while classes are few
        ax.plot(x, mean, marker=MARKERS[i % len(MARKERS)] if few else None, ms=5,
                lw=(2.4 if ref else 1.4) * (1 if few else 0.6), ls="--" if ref else "-", color=colours[m],
                label=f"{m} (reference)" if ref else m, zorder=3 if ref else 2)
    if k <= 30:
        ax.set_xticks(x, [s.class_names[c] for c in order], rotation=40, ha="right")
        ax.set_xlabel("class (sorted by reference accuracy)")
    else:
        ax.set_xlabel("class rank by reference accuracy (0 = lowest)")
    ax.set_xlim(-0.5, k - 0.5)
    ax.set_ylabel("test accuracy (%)")
    ax.grid(axis="y", alpha=0.4)
    ax.legend(loc="best", fontsize=9, framealpha=0.9)
    fig.suptitle(f"Per-class accuracy (mean over seeds) — {s.title}", fontsize=11)
    return _save(fig, path)


def plot_groups(s: Summary, path: Path) -> Path:
    """Bars of Easy / Medium / Hard / Worst per method with std-over-seeds error bars."""
    cols = ["Easy", "Medium", "Hard", "Worst"]
    n = len(s.methods)
    width = 0.8 / n
    fig = _figure(max(8.0, 1.6 + 0.45 * n * len(cols)), 5.0)
    ax = fig.add_subplot()
    colours = method_colours(s)
    means = np.array([[s.mean[m][c] for c in cols] for m in s.methods])  # [M, 4]
    stds = np.array([[s.std[m][c] for c in cols] for m in s.methods])
    for i, m in enumerate(s.methods):
        pos = np.arange(len(cols)) - 0.4 + width * (i + 0.5)
        bars = ax.bar(pos, means[i], width * 0.92, yerr=stds[i], capsize=3, color=colours[m],
                      label=f"{m} (reference)" if m == s.reference else m, edgecolor="white", linewidth=0.5)
        ax.bar_label(bars, fmt="%.1f", fontsize=7, padding=2, rotation=90 if n > 3 else 0)
    lo = float(np.nanmin(means - stds))
    bottom = max(0.0, 10 * np.floor((lo - 8) / 10))
    ax.set_ylim(bottom, min(105.0, float(np.nanmax(means + stds)) + 8))
    ax.set_xticks(np.arange(len(cols)), cols)
    ax.set_xlabel("class group (from the reference method)")
    ax.set_ylabel("accuracy (%)" + (f" — axis starts at {bottom:.0f}" if bottom > 0 else ""))
    ax.grid(axis="y", alpha=0.4)
    ax.legend(fontsize=9, ncols=min(n, 5), loc="upper right")
    fig.suptitle(f"Group accuracy, mean ± std over seeds — {s.title}", fontsize=11)
    return _save(fig, path)


def mr2_method(s: Summary, results: dict[str, Any]) -> str | None:
    """The MR2-family method whose variability is plotted: ``mr2`` if run, else the first with ``variability``."""
    have = [m for m in s.methods if any("variability" in r for r in results["runs"] if r["method"] == m)]
    return MR2_FAMILY_FIRST if MR2_FAMILY_FIRST in have else (have[0] if have else None)


def plot_variability(s: Summary, results: dict[str, Any], path: Path) -> Path | str:
    """Class variability v_k (mean over seeds) against reference accuracy, coloured by γ_k; Spearman ρ in the
    title. Returns the path, or a note (str) when there is no MR2-family run to take v_k from."""
    from scipy.stats import spearmanr

    method = mr2_method(s, results)
    if method is None:
        return "variability.png skipped: no MR2-family run (method with class variability) in results.json"
    runs = [r for r in results["runs"] if r["method"] == method and "variability" in r]
    v = np.mean([r["variability"] for r in runs], axis=0)
    gamma = np.mean([r["margins"] for r in runs], axis=0) if all("margins" in r for r in runs) else None
    acc = 100 * s.acc[s.reference].mean(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = spearmanr(v, acc)
    rho, p = float(res.statistic), float(res.pvalue)
    fig = _figure(8.5, 6.0)
    ax = fig.add_subplot()
    sc = ax.scatter(acc, v, c=gamma if gamma is not None else "tab:blue", cmap="viridis", s=70,
                    edgecolors="0.2", linewidths=0.6, zorder=3)
    if gamma is not None:
        fig.colorbar(sc, ax=ax, label=f"MR2 logit margin γ_k ({method}, mean over seeds)")
    hard = set(s.groups.hard.tolist())
    if len(v) <= 30:
        for c, name in enumerate(s.class_names):
            ax.annotate(name, (acc[c], v[c]), xytext=(5, 4), textcoords="offset points", fontsize=8,
                        fontweight="bold" if c in hard else "normal")
    ax.set_xlabel(f"reference ({s.reference}) test accuracy (%)")
    ax.set_ylabel(f"class variability v_k ({method}, mean over seeds)")
    ax.grid(alpha=0.4)
    rho_text = (f"Spearman ρ = {rho:+.2f} (p = {p:.2g})" if np.isfinite(rho)
                else "Spearman ρ undefined (constant input)")
    fig.suptitle(f"Do hard classes vary more? {rho_text}\n{s.title}; ρ < 0 supports MR2's premise"
                 + ("; hard classes in bold" if len(v) <= 30 else ""), fontsize=10)
    return _save(fig, path)


def plot_tradeoff(s: Summary, path: Path) -> Path | str:
    """ΔHard (y) against ΔEasy (x) per method with std-over-seeds error bars and quadrant lines at 0."""
    others = [m for m in s.methods if m != s.reference]
    if not others:
        return "tradeoff.png skipped: only the reference method was run"
    colours = method_colours(s)
    dx = np.array([s.mean[m]["ΔEasy"] for m in others])
    dy = np.array([s.mean[m]["ΔHard"] for m in others])
    ex = np.array([s.std[m]["ΔEasy"] for m in others])
    ey = np.array([s.std[m]["ΔHard"] for m in others])
    fig = _figure(10.0, 6.5)
    ax = fig.add_subplot()
    r = float(np.nanmax(np.abs(np.concatenate([dx - ex, dx + ex, dy - ey, dy + ey, [0.5]])))) * 1.25
    ax.set_xlim(-r, r)
    ax.set_ylim(-r, r)
    if r > 8:  # one far outlier would squash the rest near 0: linear within ±1 point, logarithmic beyond
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_yscale("symlog", linthresh=1.0)
    ax.fill_between([0, r], 0, r, color=GROUP_COLOURS["easy"], zorder=0)
    ax.text(0.98, 0.98, "better on hard\nwithout hurting easy", transform=ax.transAxes, ha="right", va="top",
            fontsize=10, color="darkgreen", fontweight="bold")
    ax.axhline(0, color="0.3", lw=1)
    ax.axvline(0, color="0.3", lw=1)
    ax.plot([0], [0], "k*", ms=12, zorder=4)
    ax.annotate(f"{s.reference} (reference)", (0, 0), xytext=(6, -12), textcoords="offset points", fontsize=8)
    # points closer than ~4% of the axis (as drawn: linear or symlog) share one label
    warp = (lambda v: np.sign(v) * np.log1p(np.abs(v))) if r > 8 else (lambda v: v)
    cell = 0.04 * warp(r)
    clusters: dict[tuple[int, int], list[int]] = {}
    for i, m in enumerate(others):
        ax.errorbar(dx[i], dy[i], xerr=ex[i], yerr=ey[i], fmt=MARKERS[(i + 1) % len(MARKERS)], ms=8, capsize=3,
                    color=colours[m], label=m, zorder=3)
        clusters.setdefault((round(warp(dx[i]) / cell), round(warp(dy[i]) / cell)), []).append(i)
    for members in clusters.values():
        i = members[0]
        names = [others[j] for j in members]
        label = ", ".join(names) if len(names) <= 3 else f"{', '.join(names[:2])} +{len(names) - 2} more"
        ax.annotate(label, (dx[i], dy[i]), xytext=(6, 6), textcoords="offset points", fontsize=8)
    ax.set_xlabel(f"ΔEasy: easy-group accuracy − {s.reference}'s (points of %)")
    ax.set_ylabel(f"ΔHard: hard-group accuracy − {s.reference}'s (points of %)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    fig.suptitle(f"Hard/easy trade-off vs {s.reference} (mean ± std over seeds)\n{s.title}", fontsize=10)
    return _save(fig, path)


def write_plots(s: Summary, results: dict[str, Any], run_dir: Path) -> tuple[list[Path], list[str]]:
    """Write every plot into ``run_dir``; return the written paths and notes about skipped plots."""
    run_dir = Path(run_dir)
    outputs = {"per_class.png": plot_per_class(s, run_dir / "per_class.png"),
               "groups.png": plot_groups(s, run_dir / "groups.png"),
               "variability.png": plot_variability(s, results, run_dir / "variability.png"),
               "tradeoff.png": plot_tradeoff(s, run_dir / "tradeoff.png")}
    for name, out in outputs.items():
        if isinstance(out, str):  # a skipped plot must not leave an older run's PNG behind
            (run_dir / name).unlink(missing_ok=True)
    return [p for p in outputs.values() if isinstance(p, Path)], [n for n in outputs.values() if isinstance(n, str)]
