"""Report plots as PNG files (matplotlib, Agg canvas; imported lazily so the CLI starts fast).

Every plot takes a :class:`~mr2probe.summary.Summary` (per-seed per-class accuracies, groups, Δs) and writes one
PNG; no pyplot global state is used, so plotting is safe inside other programs. Every plot is built to stay
readable from K = 10 to K = 1000 classes and from 2 to 20+ methods:

    per_class.png    the reference's accuracy per class (top) and a heat map of every method's Δ against it
                     (methods × classes sorted by the reference's ranking accuracy; binned past K = 100)
    groups.png       Easy / Medium / Hard / Worst per method (one panel each, methods as rows), error bars =
                     sample SD over seeds
    variability.png  MR2 class variability v_k against reference accuracy, colour = margin γ_k, Spearman r_s
    tradeoff.png     ΔHard against ΔEasy per method (error bars = sample SD over seeds of the paired differences)
    summary.png      across runs (``report`` with several run folders): every method's ΔHard with its 95% CI,
                     one band per run — a forest plot (e.g. a dose–response, one run per dose)

A method looks the same in every plot (:func:`method_styles`): a unique (colour, marker) pair, the reference
near-black, the null control grey ("no effect").
"""
from __future__ import annotations

import textwrap
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .atomic import atomic_write
from .csvnames import csv_labels

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from .results import RunResults
    from .summary import Summary

DPI = 100
PNG_COLOURS = 128  # indexed PNG (see _save)
GROUP_COLOURS = {"hard": "#f4cccc", "medium": "#fff2cc", "easy": "#d9ead3"}
REFERENCE_STYLE = ("#262626", "*")  # near-black star, as at the origin of the trade-off plot
NULL_STYLE = ("#8c8c8c", "X")  # grey: what "no effect" looks like
# tab20 without its grey pair (reserved for the null control), dark shades first: 18 colours. 7 markers, and
# gcd(18, 7) = 1, so the i-th other method's (colour i mod 18, marker i mod 7) is unique for i < 126; the two
# shades of one hue (methods i and i + 9) always get different markers.
PALETTE_INDICES = (0, 2, 4, 6, 8, 10, 12, 16, 18, 1, 3, 5, 7, 9, 11, 13, 17, 19)
MARKERS = "osD^vPh"
MARKER_EDGE = "0.2"  # a dark rim keeps the light tab20 shades visible on white
NAMES_UP_TO = 40  # class names on the per-class axis up to this K, class ranks beyond
BIN_ABOVE = 100  # per-class plot: one column per class up to this K, quantile bins beyond
BINS = 50  # about this many bins (split between the groups in proportion to their size)
ANNOTATE_UP_TO = 20  # write the Δ into the heat-map cells up to this many columns
MR2_FAMILY_FIRST = "mr2"


def _figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: Path) -> Path:
    """Write the PNG through a temporary name (:func:`~mr2probe.atomic.atomic_write`): never a half-written plot.

    The figure is drawn at :data:`DPI` and stored as an indexed PNG of at most :data:`PNG_COLOURS` colours (median
    cut, no dithering): flat fills, text and a colour map need no more, and the file is ~3× smaller than RGBA."""
    from PIL import Image

    fig.canvas.draw()
    rgb = Image.fromarray(np.asarray(fig.canvas.buffer_rgba())[..., :3])
    img = rgb.quantize(colors=PNG_COLOURS, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    atomic_write(Path(path), lambda tmp: img.save(tmp, format="PNG", optimize=True))
    return path


def method_styles(s: Summary) -> dict[str, tuple[str, str]]:
    """One (colour as ``#rrggbb``, marker) per method, the same in every plot and unique within the run: the
    reference a near-black star, the null control a grey X, every other method (in ``s.methods`` order) the
    next tab20 colour (grey excluded) and the next of :data:`MARKERS` (unique pairs for up to 126 of them)."""
    others = [m for m in s.methods if m not in (s.reference, s.null)]
    styles = {m: _style(i) for i, m in enumerate(others)}
    styles[s.reference] = REFERENCE_STYLE
    if s.null:
        styles[s.null] = NULL_STYLE
    return styles


def method_colours(s: Summary) -> dict[str, str]:
    """The colour of :func:`method_styles` per method."""
    return {m: c for m, (c, _) in method_styles(s).items()}


def class_order(s: Summary) -> np.ndarray:
    """Classes sorted by the reference accuracy used for grouping (ascending, stable): hard first."""
    return np.argsort(s.rank_acc, kind="stable")


def _ranked_on(s: Summary) -> str:
    """What every plot states about the groups."""
    return f"groups from {s.reference} ranked on {s.group_on}"


def _spans(s: Summary) -> list[tuple[str, int, int]]:
    """(group, first rank, end rank) in :func:`class_order`: hard, medium, easy."""
    k = len(s.class_names)
    n_hard, n_easy = len(s.groups.hard), len(s.groups.easy)
    return [("hard", 0, n_hard), ("medium", n_hard, k - n_easy), ("easy", k - n_easy, k)]


def class_bins(s: Summary) -> list[np.ndarray]:
    """The per-class plot's columns as arrays of class ranks (positions in :func:`class_order`): one class each
    up to K = :data:`BIN_ABOVE`; beyond, about :data:`BINS` quantile bins of the ranking, split between hard /
    medium / easy in proportion to their size so that no bin straddles two groups."""
    k = len(s.class_names)
    if k <= BIN_ABOVE:
        return [np.array([r]) for r in range(k)]
    out: list[np.ndarray] = []
    for _, lo, hi in _spans(s):
        if hi > lo:
            out += np.array_split(np.arange(lo, hi), max(1, min(hi - lo, round(BINS * (hi - lo) / k))))
    return out


def _nanmean(a: np.ndarray, axis: int = 0) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a class without test images: NaN, not a warning
        return np.nanmean(a, axis=axis)


def _label(s: Summary, m: str) -> str:
    return f"{m} (reference)" if m == s.reference else f"{m}: no effect" if m == s.null else m


def plot_per_class(s: Summary, path: Path) -> Path:
    """Per-class accuracy without spaghetti, for any K and any number of methods.

    Columns are the classes sorted by the accuracy the groups were ranked on (``s.rank_acc``: the reference's
    ``s.group_on`` accuracy), hard first; the hard / medium / easy bands are shaded on top and separated by
    black lines below. Top panel: the reference's test accuracy (mean over seeds) and, unless the groups were
    ranked on test, the ranking accuracy itself (dashed grey). Bottom panel: a heat map, one row per method
    (the reference is the zero it is compared with; the null control, when run, is the last row, in grey: the
    size of Δ that means "no effect"), cell = the method's mean test accuracy over seeds − the reference's
    (points of %), diverging colours centred at 0 (blue better, red worse; clipped at the 98th percentile of
    |Δ|, the colour bar's arrows say so). Up to K = :data:`ANNOTATE_UP_TO` the cells carry their value; up to
    K = :data:`NAMES_UP_TO` the class names label the axis, beyond it the class rank (0 = hardest). Past
    K = :data:`BIN_ABOVE` a column is a bin of consecutive ranks (about :data:`BINS` quantile bins, none
    straddling two groups, :func:`class_bins`) holding the mean Δ of its classes, and the top panel shows every
    class as a faint dot with the bins' means as a line."""
    from matplotlib.ticker import MaxNLocator

    k = len(s.class_names)
    order = class_order(s)
    x = np.arange(k)
    bins = class_bins(s)
    binned = k > BIN_ABOVE
    edges = np.array([b[0] for b in bins] + [k]) - 0.5
    styles = method_styles(s)
    rows = [m for m in s.methods if m not in (s.reference, s.null)] + ([s.null] if s.null else [])
    ref = 100 * _nanmean(s.acc[s.reference])[order]
    delta = np.array([[_nanmean((100 * _nanmean(s.acc[m])[order] - ref)[b]) for b in bins] for m in rows]
                     ).reshape(len(rows), len(bins))

    names = k <= NAMES_UP_TO
    heat_h = max(0.9, 0.27 * len(rows)) if rows else 0.0
    width = max(9.0, min(15.0, 0.33 * k + 4.5)) if names else 13.0
    bottom_h = (0.4 + 0.075 * max(len(n) for n in s.class_names)) if names else 0.5
    fig = _figure(width, 1.0 + 2.1 + heat_h + bottom_h + 0.8)
    gs = fig.add_gridspec(2 if rows else 1, 1, height_ratios=[2.1, heat_h] if rows else [1.0])
    top = fig.add_subplot(gs[0])
    heat = fig.add_subplot(gs[1], sharex=top) if rows else None
    axis = heat if heat is not None else top  # the one that carries the class axis

    for name, lo, hi in _spans(s):
        if hi > lo:
            top.axvspan(lo - 0.5, hi - 0.5, color=GROUP_COLOURS[name], zorder=0)
            top.text((lo + hi - 1) / 2, 1.01, f"{name} ({hi - lo})", transform=top.get_xaxis_transform(),
                     ha="center", va="bottom", fontsize=10, fontweight="bold", color="0.3")
            if lo > 0 and heat is not None:
                heat.axvline(lo - 0.5, color="k", lw=1.6, zorder=4)
    colour = styles[s.reference][0]
    if binned:
        top.plot(x, ref, ".", ms=2.5, color=colour, alpha=0.3, label=f"{s.reference} test accuracy per class")
        centres = np.array([b.mean() for b in bins])
        top.plot(centres, [_nanmean(ref[b]) for b in bins], "-", lw=1.8, color=colour,
                 label=f"{s.reference} test accuracy, mean per bin")
    else:
        top.plot(x, ref, "-", marker="o" if k <= 40 else ".", ms=4, lw=1.6, color=colour,
                 label=f"{s.reference} test accuracy (mean over seeds)")
    if s.group_on != "test":
        top.plot(x, 100 * np.asarray(s.rank_acc, dtype=float)[order], "--", lw=1.3, color="0.45",
                 label=f"{s.reference} {s.group_on} accuracy: the ranking")
    top.set_ylabel(f"{s.reference}\naccuracy (%)")
    top.grid(axis="y", alpha=0.4)
    top.legend(loc="upper left", fontsize=8, framealpha=0.9)
    if heat is not None:
        top.tick_params(labelbottom=False)
        _delta_heatmap(fig, heat, s, rows, delta, edges, heat_h)
    axis.set_xlim(-0.5, k - 0.5)
    if names:
        axis.set_xticks(x, [s.class_names[c] for c in order], rotation=45 if k > 12 else 35, ha="right",
                        rotation_mode="anchor", fontsize=8 if k > 20 else 9)
        axis.set_xlabel(f"class, sorted by {s.reference}'s {s.group_on} accuracy (hardest first)")
    else:
        axis.xaxis.set_major_locator(MaxNLocator(12, integer=True))
        axis.set_xlabel(f"class rank by {s.reference}'s {s.group_on} accuracy (0 = hardest)"
                        + (f"; {len(bins)} bins of about {k // len(bins)} classes, mean Δ per bin" if binned else ""))
    axis.tick_params(axis="x", length=3)
    what = f"{len(bins)} quantile bins of the ranking, mean Δ per bin" if binned else "one column per class"
    fig.suptitle(f"Per-class test accuracy Δ vs {s.reference} (mean over seeds; {_ranked_on(s)}; K = {k}, {what})"
                 + ("" if rows else "; no other method to compare") + f"\n{s.title}", fontsize=10)
    return _save(fig, path)


def _delta_heatmap(fig: Figure, heat: Any, s: Summary, rows: list[str], delta: np.ndarray, edges: np.ndarray,
                   heat_h: float) -> None:
    """The per-class plot's Δ panel: ``delta`` [rows, columns] over column ``edges`` (in class ranks)."""
    from matplotlib import colormaps
    from matplotlib.colors import Normalize

    finite = np.abs(delta[np.isfinite(delta)])
    vmax = max(float(np.percentile(finite, 98)) if finite.size else 1.0, 0.05)
    cmap = colormaps["RdBu"].with_extremes(bad="0.85")
    mesh = heat.pcolormesh(edges, np.arange(len(rows) + 1) - 0.5, np.ma.masked_invalid(delta), cmap=cmap,
                           norm=Normalize(-vmax, vmax), zorder=1)
    heat.set_ylim(len(rows) - 0.5, -0.5)
    heat.set_yticks(np.arange(len(rows)), [_label(s, m) for m in rows], fontsize=8 if len(rows) > 12 else 9)
    for tick, m in zip(heat.get_yticklabels(), rows):
        if m == s.null:
            tick.set_color("0.4")
    if s.null and len(rows) > 1:
        heat.axhline(len(rows) - 1.5, color="k", lw=1.0, ls="--", zorder=4)
    n_cols = len(edges) - 1
    if n_cols <= ANNOTATE_UP_TO and len(rows) <= 30:
        fmt = "{:+.2f}" if vmax < 1 else "{:+.1f}"
        for i in range(len(rows)):
            for j in range(n_cols):
                v = delta[i, j]
                if np.isfinite(v):
                    heat.text((edges[j] + edges[j + 1]) / 2, i, fmt.format(v), ha="center", va="center",
                              fontsize=7, color="white" if abs(v) > 0.6 * vmax else "0.1", zorder=3)
    extend = "both" if finite.size and finite.max() > vmax else "neither"
    fig.colorbar(mesh, ax=heat, extend=extend, pad=0.01, fraction=0.03, aspect=max(4.0, 2.5 * heat_h),
                 label=f"Δ vs {s.reference} (points)")


def plot_groups(s: Summary, path: Path) -> Path:
    """Easy / Medium / Hard / Worst: one panel each, one row per method (reference first, null control last), a
    dot at the mean over seeds with the sample SD over seeds as error bar and the value beside it; the
    reference's mean a dashed line and the null control's mean ± SD a grey band ("no effect") through every row.
    Methods label the rows instead of a legend, so it reads the same with 2 or 20 methods and for any K."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    cols = ["Easy", "Medium", "Hard", "Worst"]
    k = len(s.class_names)
    sizes = {"Easy": f"top {len(s.groups.easy)} classes", "Medium": f"{len(s.groups.medium)} classes",
             "Hard": f"bottom {len(s.groups.hard)} classes", "Worst": "lowest class"}
    styles = method_styles(s)
    rows = [s.reference] + [m for m in s.methods if m not in (s.reference, s.null)] + ([s.null] if s.null else [])
    n = len(rows)
    fig = _figure(13.0, 1.9 + 0.3 * max(n, 3))
    axes = fig.subplots(1, len(cols), sharey=True)
    y = np.arange(n)
    one_seed = all(not np.isfinite(s.std[m][c]) for m in rows for c in cols)
    for ax, c in zip(axes, cols):
        mean = np.array([s.mean[m][c] for m in rows])
        sd = np.nan_to_num(np.array([s.std[m][c] for m in rows]))
        ref_mean = s.mean[s.reference][c]
        if np.isfinite(ref_mean):
            ax.axvline(ref_mean, color=REFERENCE_STYLE[0], ls="--", lw=1.0, zorder=1)
        nm, nsd = (s.mean[s.null][c], np.nan_to_num(s.std[s.null][c])) if s.null else (np.nan, 0.0)
        if np.isfinite(nm):
            ax.axvspan(nm - nsd, nm + nsd, color="0.6", alpha=0.3, lw=0, zorder=0)
        ok = np.isfinite(mean)
        lo, hi = (float((mean - sd)[ok].min()), float((mean + sd)[ok].max())) if ok.any() else (np.nan, np.nan)
        if not ok.any():  # e.g. K < 3: no hard / easy classes
            ax.text(0.5, 0.5, "no classes in this group", transform=ax.transAxes, ha="center", va="center",
                    fontsize=9, color="0.4")
        fmt = "{:.2f}" if hi - lo < 2 else "{:.1f}"
        colours = [styles[m][0] for m in rows]
        ax.hlines(y, mean - sd, mean + sd, colors=colours, lw=1.2, zorder=2)  # error bars: one artist per panel
        ax.scatter(np.r_[mean - sd, mean + sd], np.r_[y, y], marker="|", s=30, c=colours + colours, lw=1.2,
                   zorder=2)
        for i, m in enumerate(rows):
            colour, marker = styles[m]
            ax.plot(mean[i], i, marker, color=colour, mec=MARKER_EDGE, mew=0.6, ms=10 if marker == "*" else 7,
                    zorder=3)
            if np.isfinite(mean[i]):
                ax.annotate(fmt.format(mean[i]), (mean[i] + sd[i], i), xytext=(4, 0), textcoords="offset points",
                            va="center", fontsize=7, color="0.15", zorder=4, annotation_clip=False,
                            bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.75}
                            ).set_in_layout(False)
        pad = max(0.3, 0.06 * (hi - lo))
        if np.isfinite(lo) and np.isfinite(hi):
            ax.set_xlim(lo - pad, hi + pad + 0.22 * (hi - lo + 2 * pad))  # room for the value labels
        ax.set_title(f"{c} ({sizes[c]})", fontsize=10)
        ax.set_xlabel("test accuracy (%)")
        ax.grid(axis="x", alpha=0.4)
        ax.tick_params(axis="x", labelsize=8)
    axes[0].set_yticks(y, [_label(s, m) for m in rows], fontsize=8 if n > 12 else 9)
    for tick, m in zip(axes[0].get_yticklabels(), rows):
        if m == s.null:
            tick.set_color("0.4")
    axes[0].set_ylim(n - 0.5, -0.5)
    handles = [Line2D([], [], color=REFERENCE_STYLE[0], ls="--", lw=1.0, label=f"{s.reference}'s mean")]
    if s.null:
        handles.append(Patch(color="0.6", alpha=0.3, label=f"{s.null} mean ± SD: no effect"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8, frameon=False)
    spread = "one seed: no SD" if one_seed else "error bars = sample SD over seeds (ddof = 1)"
    fig.suptitle(f"Group accuracy per method, mean over seeds; {spread}; {_ranked_on(s)} (K = {k})\n{s.title}",
                 fontsize=10)
    return _save(fig, path)


def mr2_method(s: Summary, results: RunResults) -> str | None:
    """The MR2-family method whose variability is plotted: ``mr2`` if run, else the first with ``variability``."""
    have = [m for m in s.methods if any(r.variability is not None for r in results.runs_of(m))]
    return MR2_FAMILY_FIRST if MR2_FAMILY_FIRST in have else (have[0] if have else None)


def plot_variability(s: Summary, results: RunResults, path: Path) -> Path | str:
    """Class variability v_k (mean over seeds) against reference accuracy, coloured by γ_k; Spearman r_s in the
    title; class names beside the points up to K = 30 (hard classes in bold), smaller points for large K.
    Returns the path, or a note (str) when there is no MR2-family run to take v_k from."""
    from scipy.stats import spearmanr

    method = mr2_method(s, results)
    if method is None:
        return "variability.png skipped: no MR2-family run (method with class variability) in results.json"
    runs = [r for r in results.runs_of(method) if r.variability is not None]
    v = np.mean([r.variability for r in runs], axis=0)
    gamma = np.mean([r.margins for r in runs], axis=0) if all(r.margins is not None for r in runs) else None
    acc = 100 * _nanmean(s.acc[s.reference])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = spearmanr(v, acc, nan_policy="omit")
    rho, p = float(res.statistic), float(res.pvalue)
    fig = _figure(8.5, 6.0)
    ax = fig.add_subplot()
    size = 70.0 if len(v) <= 30 else max(6.0, 70.0 * 30 / len(v) ** 0.9)
    sc = ax.scatter(acc, v, c=gamma if gamma is not None else "tab:blue", cmap="viridis", s=size,
                    edgecolors="0.2", linewidths=0.6 if len(v) <= 100 else 0.2, alpha=1.0 if len(v) <= 100 else 0.8,
                    zorder=3)
    if gamma is not None:
        fig.colorbar(sc, ax=ax, label=f"MR2 logit margin γ_k ({method}, mean over seeds)")
    hard = set(s.groups.hard.tolist())
    if len(v) <= 30:
        for c, name in enumerate(s.class_names):
            ax.annotate(name, (acc[c], v[c]), xytext=(5, 4), textcoords="offset points", fontsize=8,
                        fontweight="bold" if c in hard else "normal")
    ax.set_xlabel(f"reference ({s.reference}) test accuracy (%, mean over seeds)")
    ax.set_ylabel(f"class variability v_k ({method}, mean over seeds)")
    ax.grid(alpha=0.4)
    rho_text = (f"Spearman r_s = {rho:+.2f} (p = {p:.2g})" if np.isfinite(rho)
                else "Spearman r_s undefined (constant input)")
    subtitle = f"{s.title}; ρ < 0 supports MR2's premise" + (f"; hard classes ({_ranked_on(s)}) in bold"
                                                                if len(v) <= 30 else "")
    fig.suptitle(f"Do hard classes vary more? {rho_text}, K = {len(v)}\n" + "\n".join(textwrap.wrap(subtitle, 110)),
                 fontsize=10)
    return _save(fig, path)


def plot_tradeoff(s: Summary, path: Path) -> Path | str:
    """ΔHard (y) against ΔEasy (x) per method with sample-SD-over-seeds error bars and quadrant lines at 0; the
    null control's mean ± SD a grey box ("no effect"); the legend outside the axes (two columns past 24
    methods); every point named beside it without overlaps (:func:`_place_labels`), so 20 methods near 0 stay
    legible."""
    from matplotlib.patches import Rectangle

    others = [m for m in s.methods if m not in (s.reference, s.null)]
    if not others:
        return "tradeoff.png skipped: only the reference method was run"
    styles = method_styles(s)
    null = [s.null] if s.null else []
    dx = np.array([s.mean[m]["ΔEasy"] for m in others])
    dy = np.array([s.mean[m]["ΔHard"] for m in others])
    ex = np.array([s.std[m]["ΔEasy"] for m in others])
    ey = np.array([s.std[m]["ΔHard"] for m in others])
    entries = len(others) + len(null) + 1
    ncols = 1 if entries <= 24 else 2
    fig = _figure(10.0 + 2.0 * (ncols - 1), max(6.5, 1.6 + 0.23 * entries / ncols))
    ax = fig.add_subplot()
    nx, ny = (np.array([s.mean[m][c] for m in null]) for c in ("ΔEasy", "ΔHard"))
    nex, ney = (np.nan_to_num(np.array([s.std[m][c] for m in null])) for c in ("ΔEasy", "ΔHard"))
    ex, ey = np.nan_to_num(ex), np.nan_to_num(ey)  # one seed: no error bar
    r = float(np.nanmax(np.abs(np.concatenate([dx - ex, dx + ex, dy - ey, dy + ey, nx - nex, nx + nex, ny - ney,
                                               ny + ney, [0.5]])))) * 1.25
    ax.set_xlim(-r, r)
    ax.set_ylim(-r, r)
    if r > 8:  # one far outlier would squash the rest near 0: linear within ±1 point, logarithmic beyond
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_yscale("symlog", linthresh=1.0)
    ax.fill_between([0, r], 0, r, color=GROUP_COLOURS["easy"], zorder=0)
    corner = ax.text(0.98, 0.98, "better on hard\nwithout hurting easy", transform=ax.transAxes, ha="right",
                     va="top", fontsize=10, color="darkgreen", fontweight="bold")
    ax.axhline(0, color="0.3", lw=1)
    ax.axvline(0, color="0.3", lw=1)
    colour, marker = REFERENCE_STYLE
    ax.plot([0], [0], marker, color=colour, ms=12, zorder=4, ls="none", label=_label(s, s.reference))
    for x, y, w, h in zip(nx, ny, nex, ney):  # the null control: what "no effect" looks like on this file
        ax.add_patch(Rectangle((x - w, y - h), 2 * w, 2 * h, facecolor="0.6", alpha=0.35, edgecolor="0.3", ls="--",
                               zorder=2, label=f"{s.null} ± SD: no effect"))
        ax.plot([x], [y], NULL_STYLE[1], color=NULL_STYLE[0], mec=MARKER_EDGE, ms=9, zorder=4)
    for i, m in enumerate(others):
        colour, marker = styles[m]
        ax.errorbar(dx[i], dy[i], xerr=ex[i], yerr=ey[i], fmt=marker, ms=8, capsize=3, color=colour,
                    mec=MARKER_EDGE, mew=0.6, label=m, zorder=3)
    ax.set_xlabel(f"ΔEasy: easy-group accuracy − {s.reference}'s (points of %)")
    ax.set_ylabel(f"ΔHard: hard-group accuracy − {s.reference}'s (points of %)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, ncols=ncols)
    fig.suptitle(f"Hard/easy trade-off vs {s.reference}: mean over seeds, error bars = sample SD over seeds "
                 f"(ddof = 1)\n{_ranked_on(s)}; K = {len(s.class_names)}; {s.title}", fontsize=10)
    _place_labels(fig, ax, np.column_stack([np.r_[0.0, dx], np.r_[0.0, dy]]),
                  [f"{s.reference} (reference)"] + others, avoid=np.column_stack([nx, ny]), keep_clear=[corner])
    return _save(fig, path)


def _overlap(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))


def _place_labels(fig: Figure, ax: Any, xy: np.ndarray, labels: list[str], avoid: np.ndarray,
                  keep_clear: list[Any], fontsize: float = 8) -> None:
    """Name every point without overlapping labels: points whose markers coincide (closer than a marker) share
    one label ("a, b, c" or "a, b +N more"); each label goes to the first spot, on rings of growing distance
    around its point, that overlaps no label placed before, no marker (``xy`` and ``avoid``) and no
    ``keep_clear`` artist and stays inside the axes (the least-overlapping spot if none is free), with a thin
    leader line once it is pushed off its point. Needs the final layout, so it draws the figure once."""
    from matplotlib.font_manager import FontProperties

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    scale = fig.dpi / 72.0
    xy, avoid = np.asarray(xy, dtype=float).reshape(-1, 2), np.asarray(avoid, dtype=float).reshape(-1, 2)
    px = ax.transData.transform(xy)
    frame = ax.get_window_extent(renderer)
    r = 5.0 * scale  # half a marker
    obstacles = [(x - r, y - r, x + r, y + r) for x, y in np.vstack([px, ax.transData.transform(avoid)])
                 if np.isfinite(x) and np.isfinite(y)]
    obstacles += [tuple(a.get_window_extent(renderer).extents) for a in keep_clear]
    groups: list[list[int]] = []
    for i, p in enumerate(px):
        if not np.all(np.isfinite(p)):  # no mean (no paired seeds): nothing drawn, nothing to name
            continue
        near = next((g for g in groups if np.hypot(*(px[g[0]] - p)) < 1.6 * r), None)
        if near is None:
            groups.append([i])
        else:
            near.append(i)
    prop = FontProperties(size=fontsize)
    for g in groups:
        names = [labels[j] for j in g]
        text = ", ".join(names) if len(names) <= 3 else f"{', '.join(names[:2])} +{len(names) - 2} more"
        w, h, _ = renderer.get_text_width_height_descent(text, prop, ismath=False)
        x, y = px[g[0]]
        best: tuple[float, float, float, tuple[float, ...], float] | None = None
        for ring in (1.0, 1.8, 2.8, 4.0, 5.5, 7.5):
            d = 5.0 * scale * ring
            for ox, oy in ((d, 0.5 * d), (d, -0.5 * d - h), (-d - w, 0.5 * d), (-d - w, -0.5 * d - h),
                           (1.2 * d, -h / 2), (-1.2 * d - w, -h / 2), (-w / 2, d), (-w / 2, -d - h)):
                b = (x + ox, y + oy, x + ox + w, y + oy + h)
                inside = frame.x0 <= b[0] and b[2] <= frame.x1 and frame.y0 <= b[1] and b[3] <= frame.y1
                cost = sum(_overlap(b, o) for o in obstacles) + (0.0 if inside else 1e9)
                if best is None or cost < best[0]:
                    best = (cost, ox, oy, b, ring)
                if cost == 0:
                    break
            if best is not None and best[0] == 0:
                break
        assert best is not None
        _, ox, oy, b, ring = best
        obstacles.append(b)
        leader = ({"arrowstyle": "-", "color": "0.55", "lw": 0.6, "shrinkA": 0, "shrinkB": r / scale}
                  if ring > 1 else None)
        ann = ax.annotate(text, xy[g[0]], xytext=(ox / scale, oy / scale), textcoords="offset points",
                          fontsize=fontsize, ha="left", va="bottom", arrowprops=leader, annotation_clip=False,
                          zorder=5)
        ann.set_in_layout(False)


def plot_across_runs(numbers: Any, path: Path) -> tuple[Path, int]:
    """Forest plot of the summary across runs (:func:`~mr2probe.summary.cross_run` rows, or summary.csv read back):
    per run a band, in it one row per method other than the run's reference with its mean ΔHard (points, paired by
    seed) and its 95% CI (the tables' two-stage SE with Student t, :mod:`~mr2probe.inference`) as a bar; the null
    control grey, 0 dashed. Returns the path and the number of rows drawn."""
    numbers = csv_labels(numbers)
    rows = numbers[(numbers["method"] != numbers["reference"]) & numbers["ΔHard"].notna()]
    runs = list(dict.fromkeys(rows["run"]))
    methods = list(dict.fromkeys(m for m in rows["method"] if "(null)" not in m))
    style = {m: _style(i) for i, m in enumerate(methods)}
    fig = _figure(7.5, 1.0 + 0.16 * len(rows) + 0.25 * len(runs))
    ax = fig.add_subplot()
    y, ticks, labels = 0.0, [], []
    for run in runs:
        block = rows[rows["run"] == run]
        for _, r in block.iterrows():
            c, marker = NULL_STYLE if "(null)" in r["method"] else style[r["method"]]
            lo, hi = r.get("ΔHard_ci_lo", np.nan), r.get("ΔHard_ci_hi", np.nan)
            if np.isfinite(lo) and np.isfinite(hi):
                ax.plot([lo, hi], [y, y], color=c, lw=1.6, solid_capstyle="butt")
            ax.plot([r["ΔHard"]], [y], marker, ms=4, color=c, mec=MARKER_EDGE, mew=0.5)
            ticks.append(y)
            labels.append(r["method"])
            y -= 1
        ax.axhline(y + 0.5, color="0.85", lw=0.8)
        ax.text(1.0, y + len(block) + 0.5, f" {run}", transform=ax.get_yaxis_transform(), va="top", ha="left",
                fontsize=8, weight="bold")
        y -= 0.5
    ax.axvline(0, color="0.3", lw=0.8, ls="--")
    ax.set_yticks(ticks, labels, fontsize=7)
    ax.set_xlabel("ΔHard (points) vs each run's reference, mean over seeds\nbar: 95% CI (two-stage SE, t)")
    ax.set_title(f"ΔHard of every method against its run's reference ({len(runs)} run{'s' * (len(runs) != 1)})"
                 + ("; grey: null control" if rows["method"].str.contains("(null)", regex=False).any() else ""),
                 fontsize=10, loc="left")
    ax.set_ylim(min(y + 0.5, -0.5), 0.5)
    ax.grid(axis="x", color="0.92")
    return _save(fig, path), len(rows)


def _style(i: int) -> tuple[str, str]:
    """The i-th (colour, marker) of the methods other than the reference and the null control."""
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    return to_hex(colormaps["tab20"](PALETTE_INDICES[i % len(PALETTE_INDICES)])), MARKERS[i % len(MARKERS)]


def write_plots(s: Summary, results: RunResults | dict[str, Any], run_dir: Path) -> tuple[list[Path], list[str]]:
    """Write every plot into ``run_dir``; return the written paths and notes about skipped plots. ``results``: the
    run's :class:`~mr2probe.results.RunResults` (or a results.json's content)."""
    from .results import RunResults

    run_dir, results = Path(run_dir), RunResults.coerce(results)
    outputs = {"per_class.png": plot_per_class(s, run_dir / "per_class.png"),
               "groups.png": plot_groups(s, run_dir / "groups.png"),
               "variability.png": plot_variability(s, results, run_dir / "variability.png"),
               "tradeoff.png": plot_tradeoff(s, run_dir / "tradeoff.png")}
    for name, out in outputs.items():
        if isinstance(out, str):  # a skipped plot must not leave an older run's PNG behind
            (run_dir / name).unlink(missing_ok=True)
    return [p for p in outputs.values() if isinstance(p, Path)], [n for n in outputs.values() if isinstance(n, str)]
