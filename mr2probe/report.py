"""The report stage: results.json (+ predictions.npz) → the protocol table (markdown, CSV, LaTeX), plots, HTML,
and a Δ summary across runs.

Groups come from the reference method (default ce) and are the same for every method; they are ranked on val by
default, each replicate pair with groups ranked on the reference's other replicates (``--groups-on
val|val-pooled|crossfit|test``, :data:`~mr2probe.settings.GROUPS_ON`). Each column is mean ± sample SD (ddof = 1)
over replicates; Δ columns are paired replicate by replicate with the reference. The null control
(``<reference> (null)``: the reference trained again on disjoint seeds) is a row like any method: its Δs and CIs
show what "no effect" looks like. CIs, p, q, the MDE and the verdicts follow one rule (:mod:`~mr2probe.inference`:
a two-stage SE over replicates and shared, paired bootstraps of test images, Student t with Welch–Satterthwaite
ν, Benjamini–Hochberg over the table's methods, TOST at ``--equivalence-margin``). The best value of each column
(as displayed, 2 decimals; ties all marked; neither the null control nor, in Δ columns, the reference is a
candidate) is bold: highest for accuracies, Δs and HardPrec, lowest for Std, Gap and ΔGap.

With test predictions (predictions.npz) the tables also carry the instruments of :class:`~mr2probe.summary.Summary`
(definitions in ``summary.INSTRUMENTS_DEFINITIONS``): HardPrec (mean precision of the hard classes, %), HardRate
(mean prediction rate / test share of the hard classes; 1.00 = predicted as often as they occur) and Sig↑/↓ (classes
whose accuracy changed against the reference at BH q < 0.05, up / down); under every table the minimum detectable
ΔHard and the stability of the hard set over the reference's seeds; in the HTML report the hard classes' top
confusions; in summary.json all of it per class. Without predictions these columns are left out.

Files per run folder: table.md, table.csv, table.tex, summary.json, [per_class|groups|variability|tradeoff].png,
[report.html]. Across runs (:func:`run_report`): summary.md + summary.csv (+ report.html).
"""
from __future__ import annotations

import base64
import html
import io
import os
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from . import predfile
from .atomic import atomic_text
from .csvnames import csv_labels, csv_name  # noqa: F401 (csv_labels: the readers' inverse)
from .errors import UserError
from .jsonfile import atomic_json
from .results import RunResults
from .metrics import COLUMNS, DELTA_COLUMNS, SIG_COLUMN
from .inference import RULE, VERDICTS
from .summary import (CI_NAMES, GRID_EDGE_RISE, Summary, best_of, cross_run, hard_set_stability, over_runs,
                      summarize)

CI_COLUMNS = [f"{c} 95% CI" for c in CI_NAMES]  # the CI columns, one per Summary CI
SHOWN_CI = [f"{c} 95% CI" for c in ("All", "Hard", "ΔHard", "ΔEasy", "ΔAll")]  # the CIs in the markdown table
Q_COLUMN, VERDICT_COLUMN = "ΔHard q", "verdict"  # BH q of ΔHard over the table's methods; its verdict
PLOT_FILES = ["per_class.png", "groups.png", "variability.png", "tradeoff.png"]
RUN_FILES = ["table.md", "table.csv", "table.tex", "summary.json", "metrics.csv", "per_class.csv"]
SUMMARY_DIGITS = 6  # summary.json holds derived statistics: six significant digits
PROTOCOL_DOC = "docs/protocol.md"  # the protocol page, in the mr2probe source tree
DELTA_CI = "ΔHard [95% CI]"  # the compact tables' ΔHard with its CI in one cell
Q_SHORT = "q"  # the compact tables' name of the ΔHard q
SHORT_NAMES = {Q_COLUMN: Q_SHORT}
COMPACT = ["All", "Hard", "Worst", DELTA_CI, VERDICT_COLUMN, Q_SHORT]  # what a person reads first
BEST_OF = {DELTA_CI: "ΔHard"}  # compact cells marked bold by the column they show


def load_results(run_dir: str | Path) -> RunResults:
    """``RUN_DIR/results.json`` (:meth:`RunResults.from_disk`: any layout; every problem a one-line
    :class:`UserError`)."""
    return RunResults.from_disk(Path(run_dir) / "results.json")


def load_predictions(run_dir: str | Path) -> dict[str, np.ndarray] | None:
    """The run folder's predictions.npz (read by ``predfile.load_predictions``), or None when it has none."""
    path = Path(run_dir) / "predictions.npz"
    if not path.is_file():
        return None
    try:
        return predfile.load_predictions(path)
    except (OSError, ValueError) as e:
        raise UserError(f"{path} is unreadable ({e}); train again or delete it to report without CIs") from None


# ---- tables ------------------------------------------------------------------------------------------------

def _fmt(m: float, sd: float, signed: bool) -> str:
    """"m ± sd" with 2 decimals; no "-0.00"; no "± nan" (one seed)."""
    m = 0.0 if abs(m) < 0.005 else m
    text = f"{'+' if signed and m > 0 else ''}{m:.2f}"
    return text if not np.isfinite(sd) else f"{text} ± {sd:.2f}"


def cell(s: Summary, method: str, col: str, sd: bool = True) -> str:
    """One displayed cell of any table column: "m ± sd" (``sd`` False: "m"), a CI "[lo, hi]", ΔHard with its CI
    "m [lo, hi]", Sig "up / down", "—" for the reference's Δ, Sig, verdict and q cells, "" where the method has no
    value (an instrument without test predictions)."""
    if method == s.reference and (col.startswith("Δ") or col in (SIG_COLUMN, VERDICT_COLUMN, Q_SHORT)):
        return "—"
    if col in CI_COLUMNS:
        v = s.ci.get(method, {}).get(col.replace(" 95% CI", ""))
        return f"[{v[0]:.1f}, {v[1]:.1f}]" if v else ""
    if col == DELTA_CI:
        mean = cell(s, method, "ΔHard", sd=False)
        ci = cell(s, method, "ΔHard 95% CI") if s.ci else ""
        return f"{mean} {ci}".strip()
    if col in (Q_COLUMN, Q_SHORT):
        q = s.q(method)
        return "" if q is None else (f"{q:.3f}" if q >= 0.001 else "<0.001")
    if col == VERDICT_COLUMN:
        return s.verdict_text(method)
    if col == SIG_COLUMN:
        counts = s.sig_counts(method)
        return f"{counts[0]} / {counts[1]}" if counts else ""
    if col not in s.mean[method]:
        return ""
    return _fmt(s.mean[method][col], s.std[method][col] if sd else float("nan"), col in DELTA_COLUMNS)


def table_columns(s: Summary) -> list[str]:
    """Every column of table.md, the HTML table and ``--wide`` (Top5 / BalancedAcc there, not in the compact
    table)."""
    return (COLUMNS + DELTA_COLUMNS + s.instrument_columns() + (SHOWN_CI if s.ci else []) + s.extra_columns()
            + [Q_COLUMN, VERDICT_COLUMN])


def compact_columns(s: Summary) -> list[str]:
    """The compact table's columns (:data:`COMPACT`), ΔHard without its CI where the run has no CIs."""
    return [("ΔHard" if c == DELTA_CI and not s.ci else c) for c in COMPACT]


def shown(s: Summary, cols: Sequence[str], sd: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The displayed table: cells as text (:func:`cell`; ``sd`` False: means without "± SD") and the bold mask
    (:meth:`Summary.best`), one row per method, index ``method``."""
    idx = pd.Index(s.methods, name="method")
    text = pd.DataFrame({c: [cell(s, m, c, sd) for m in s.methods] for c in cols}, index=idx, dtype=object)
    best = {c: s.best(BEST_OF.get(c, c)) for c in cols}
    bold = pd.DataFrame({c: [m in best[c] for m in s.methods] for c in cols}, index=idx, dtype=bool)
    return text, bold


def markdown_table(text: pd.DataFrame, bold: pd.DataFrame) -> str:
    """A GitHub pipe table of the displayed cells (index as the first column), bold as ``**…**``."""
    text = text.astype(str)  # a frame with no rows (a suite whose only method is the reference) has float columns
    return text.mask(bold, "**" + text + "**").reset_index().to_markdown(index=False, disable_numparse=True)


def html_table(text: pd.DataFrame, bold: pd.DataFrame) -> str:
    """An HTML table of the displayed cells (index as the first column), every cell escaped, bold as ``<b>``, each
    verdict in a ``<span class="v-VERDICT">`` (coloured by the page's style)."""
    esc = text.map(lambda v: html.escape(str(v)))
    for c in esc.columns:
        if str(c).startswith(VERDICT_COLUMN):
            esc[c] = [f"<span class='v-{v}'>{v}</span>" if v.isalpha() else v for v in esc[c]]
    esc = esc.mask(bold, "<b>" + esc + "</b>").reset_index()
    esc.columns = [html.escape(SHORT_NAMES.get(str(c), str(c))) for c in esc.columns]
    return esc.to_html(index=False, escape=False, border=0)


def html_text(line: str) -> str:
    """One line of prose as HTML: escaped, `code` as ``<code>``, [text](link) as a link."""
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(line))
    return re.sub(r"\[([^]]+)\]\(([^)]+)\)", r"<a href='\2'>\1</a>", out)


def footnotes(s: Summary) -> list[str]:
    """The lines printed under every table: the inference rule and the verdicts, the minimum detectable ΔHard,
    the stability of the hard set over the reference's seeds, and what the instrument columns mean (or that they
    need predictions)."""
    lines = [inference_line(s), mde_line(s)]
    st = s.seed_stability
    if st.get("value") is not None:
        lines.append(f"Hard-set stability across seeds ({s.reference}, each seed ranked on its own {st['ranked_on']} "
                     f"accuracy): mean pairwise Jaccard {st['value']:.2f} over {st['seeds']} seeds "
                     f"({st['pairs']} pair{'s' * (st['pairs'] != 1)})")
    else:
        why = "one seed" if st.get("seeds", 0) < 2 else "no hard classes"
        lines.append(f"Hard-set stability across seeds ({s.reference}): not available ({why})")
    edges = grid_edge_line(s)
    lines += [edges] if edges else []
    check = reference_check_line(s)
    lines += [check] if check else []
    lines += s.notes  # the groups' warnings and the MR2 manipulation check
    cols = s.instrument_columns()
    if cols:
        lines.append("HardPrec: mean precision of the hard classes (%); HardRate: mean over the hard classes of "
                     "#predicted / #true (1.00 = predicted as often as they occur, > 1 over-predicted); "
                     f"{SIG_COLUMN}: classes whose accuracy changed against {s.reference} at q < 0.05 (exact "
                     "McNemar per class on seed-mean correctness per image, Benjamini–Hochberg over classes), "
                     "up / down")
    else:
        lines.append(f"HardPrec, HardRate, {SIG_COLUMN}: not shown (no predictions.npz in this run folder)")
    return lines


def grid_edge_line(s: Summary) -> str | None:
    """The choices at an end of their val grid (:func:`~mr2probe.summary.grid_edges`), grouped by value, with a
    warning when the reference is among them; None when there are none. The null control is left out (it is the
    reference again)."""
    rows = [r for r in s.grid_edges if r["method"] != s.null]
    if not rows:
        return None
    groups: dict[tuple[Any, ...], list[str]] = {}
    for r in rows:
        who = r["method"] + ("" if r["runs"] == r["of"] else f" {r['runs']}/{r['of']}")
        groups.setdefault((r["param"], r["value"], r["end"], r["grid_min"], r["grid_max"]), []).append(who)
    text = "; ".join(f"{p} = {v:g} ({end} of {lo:g}…{hi:g}): {', '.join(who)}"
                     for (p, v, end, lo, hi), who in groups.items())
    line = (f"Chosen at an end of a val grid of ≥ 3 values, the val score still rising there (by > "
            f"{100 * GRID_EDGE_RISE:g} point over the next value inwards; a wider grid might do better; \"m k/n\": "
            f"in k of the method's n runs, else in all): {text}")
    warning = reference_edge_warning(s)
    return line + (f". {warning}" if warning else "")


def reference_edge_warning(s: Summary) -> str | None:
    """"The reference … may be under-fit" when one of its choices sat at an end of its val grid, else None."""
    ref = [r for r in s.grid_edges if r["method"] == s.reference]
    if not ref:
        return None
    what = ", ".join(f"{r['param']} = {r['value']:g} (the {r['end']} of its grid, +{r['rise']:.2f} points of val "
                     f"accuracy over the next value) in {r['runs']}/{r['of']} runs" for r in ref)
    return f"The reference {s.reference} chose {what}: it may be under-fit; widen that grid"


def reference_check_line(s: Summary) -> str | None:
    """The reference's overall accuracy against the exact logistic regression
    (:func:`~mr2probe.summary.reference_probe_check`), a warning when it is further below than the protocol allows;
    None when the run has no logreg row."""
    c = s.reference_check
    if c is None:
        return None
    vg = c.get("val_gap")  # the same gap on val: what the budget and grids were chosen on
    val = "" if vg is None else f" (on val {c['probe']} {vg:+.2f})"
    within = f"({c['probe']} {c['gap']:+.2f}" + ("" if vg is None else f"; on val {vg:+.2f}") + ")"
    steps = "" if c.get("steps") is None else f"{c['steps']} steps"
    if c.get("checkpoints"):
        how = (f"checkpoints {', '.join(str(x) for x in c['checkpoints'])} steps chosen per method on val, "
               f"{s.reference} at {', '.join(str(x) for x in c['reference_checkpoints']) or '?'}")
        budget = f" (budget: {how})"
        if c["under_fit"]:
            return (f"Reference check: {c['probe']} (exact L2 logistic regression, C on val) is {c['gap']:+.2f} "
                    f"points above {s.reference} on All{val}, more than the protocol's {c['tolerance']:g}: the "
                    f"reference may be under-fit (a larger --max-steps or a wider grid){budget}")
        return (f"Reference check: {s.reference} is within {c['tolerance']:g} point of {c['probe']} (exact L2 "
                f"logistic regression, C on val) on All {within}{budget}" if c["gap"] >=
                -c["tolerance"] else f"Reference check: {s.reference} is {-c['gap']:.2f} points above {c['probe']} "
                f"(exact L2 logistic regression, C on val) on All{val}{budget}")
    if c.get("calibrated"):
        how = f"{steps} by the reach-logreg rule" + (", reached on val" if c["reached"] else
                                                    ", its ceiling: not reached on val (raise --max-steps)")
    else:
        how = steps + (" by the floor rule; --budget-rule reach-logreg calibrates it on val" if c["under_fit"] else "")
    budget = f" (budget: {how})" if how else ""
    if c["under_fit"] and c.get("calibrated") and c["reached"]:
        # the budget was raised until the reference matched logreg on val: more steps are not what test lacks
        return (f"Reference check: {c['probe']} (exact L2 logistic regression, C on val) is {c['gap']:+.2f} points "
                f"above {s.reference} on All{val}, more than the protocol's {c['tolerance']:g}, although the budget "
                f"reached it on val ({how}): a difference between val and test, or the reference's grid (learning "
                f"rate, weight decay), not too few steps")
    if c["under_fit"]:
        return (f"Reference check: {c['probe']} (exact L2 logistic regression, C on val) is {c['gap']:+.2f} points "
                f"above {s.reference} on All{val}, more than the protocol's {c['tolerance']:g}: the reference may be "
                f"under-fit on these features (a larger step budget or grid{'; budget: ' + how if how else ''})")
    if c["gap"] < -c["tolerance"]:
        return (f"Reference check: {s.reference} is {-c['gap']:.2f} points above {c['probe']} (exact L2 logistic "
                f"regression, C on val) on All{val}{budget}")
    return (f"Reference check: {s.reference} is within {c['tolerance']:g} point of {c['probe']} (exact L2 logistic "
            f"regression, C on val) on All {within}{budget}")


def mde_line(s: Summary) -> str:
    """"Minimum detectable ΔHard …: V points (how it was computed)" or why it is not available."""
    if s.mde is not None and np.isfinite(s.mde["value"]):
        return (f"Minimum detectable ΔHard (80% power, α = 0.05): {s.mde['value']:.2f} points "
                f"({s.mde['describe']})")
    return ("Minimum detectable ΔHard (80% power, α = 0.05): not available (needs 2 replicates or predictions.npz, "
            "and hard classes)")


def inference_line(s: Summary) -> str:
    """How the CIs, q-values and verdicts were made, and the count of each verdict of ΔHard."""
    counts = pd.Series([s.verdict(m) for m in s.methods if m not in (s.reference, s.null)]).value_counts()
    told = ", ".join(f"{n} {v}" for v, n in counts.items() if v) or "none"
    groups = ("each replicate pair scored with groups ranked on the reference's other replicates" if s.loo_groups
              else f"groups ranked on {s.group_on}")
    null = ""
    e = s.inference.get(s.null or "", {}).get("ΔHard", {})
    if s.verdict(s.null or "") and e.get("ci", [None])[0] is not None:
        null = (f"; null control ΔHard {e['estimate']:+.2f} [{e['ci'][0]:+.2f}, {e['ci'][1]:+.2f}] "
                f"({s.verdict(s.null)})")
    return (f"Inference: {RULE}; {groups}. Verdicts of ΔHard (BH q < 0.05 over the table's methods: better / worse; "
            f"else TOST at ±{s.margin:g} points where the table's MDE is ≤ it: equivalent; else underpowered or "
            f"inconclusive; identical: the reference's predictions): {told}{null}")


# short, so that the legend's verdict line fits 100 columns (q: BH; ±m: TOST; MDE: the protocol page says how)
VERDICT_MEANING = {"better": "q < 0.05", "worse": "q < 0.05", "equivalent": "±{m:g}", "inconclusive": "neither",
                   "underpowered": "MDE > ±{m:g}", "identical": "= reference"}


def protocol_link(where: Path | None) -> str | None:
    """The protocol page relative to the folder ``where`` (a link that works in the source tree, e.g. on GitHub),
    or None when ``where`` is not inside the source tree that holds :data:`PROTOCOL_DOC` (an installed package)."""
    doc = Path(__file__).resolve().parents[1] / PROTOCOL_DOC
    if where is None or not doc.is_file():
        return None
    try:
        Path(where).resolve().relative_to(doc.parents[1])
    except ValueError:
        return None
    return Path(os.path.relpath(doc, Path(where).resolve())).as_posix()


def legend(s: Summary, link: str | None = None, sd: bool = True) -> list[str]:
    """Three short lines read with the compact table: units and groups; the verdicts present and what each means;
    the null control and where the rest is (``link``: the protocol page, else its path in the source). ``sd``
    False: the table shows means only."""
    verdicts = sorted({v for m in s.methods if m != s.reference and (v := s.verdict(m))},
                      key=lambda v: (v not in VERDICT_MEANING, list(VERDICT_MEANING).index(v) if v in VERDICT_MEANING
                                     else 0, v))
    by_meaning: dict[str, list[str]] = {}
    for v in verdicts:
        by_meaning.setdefault(VERDICT_MEANING.get(v, "see the protocol").format(m=s.margin), []).append(v)
    told = "; ".join(f"{'/'.join(vs)} {meaning}" for meaning, vs in by_meaning.items()) or "no verdicts"
    null = f"{s.null}: {s.reference} on other seeds (no effect). " if s.null else ""
    page = f"[protocol]({link})" if link else PROTOCOL_DOC
    return [f"% of test, mean{' ± SD' if sd else ''} over seeds; Hard: {s.reference}'s {len(s.groups.hard)} "
            f"lowest classes on {s.group_on}; Δ: vs {s.reference}, paired by seed",
            f"ΔHard verdicts: {told}",
            f"{null}Every column: --wide, table.md, table.csv; definitions: {page}"]


def to_markdown(s: Summary, link: str | None = None) -> str:
    """table.md: the title, the :func:`legend` (``link``: the protocol page), every column, then the lines under
    the table and how the table was made (:meth:`Summary.header`)."""
    text, bold = shown(s, table_columns(s))
    lines = [f"**{s.title}** — best per column in bold", ""] + [x + "  " for x in legend(s, link)]
    return "\n".join(lines + ["", markdown_table(text, bold), ""] + footnotes(s)
                     + [f"How this table was made: {s.header()}"]) + "\n"


def _replicates(s: Summary, results: RunResults, method: str) -> pd.DataFrame:
    """``seed`` and ``episode`` of the method's replicates, in the order of the Summary's per-seed arrays (the
    order of results.json)."""
    runs = results.runs_of(method)
    return pd.DataFrame({"seed": [r.seed for r in runs], "episode": [r.episode for r in runs]})


def metrics_long(s: Summary, results: RunResults, run: str) -> pd.DataFrame:
    """metrics.csv: one row per (run, method, seed, episode, metric) with the replicate's value of every mean ± SD
    column of the table (points of %; Δs paired with the reference's replicate of the same index), metric names
    as in table.csv (:func:`csv_name`)."""
    frames = []
    for m in s.methods:
        wide = pd.DataFrame(s.per_seed[m]).rename(columns=csv_name)
        wide = pd.concat([_replicates(s, results, m), wide], axis=1).assign(run=run, method=m)
        frames.append(wide.melt(id_vars=["run", "method", "seed", "episode"], var_name="metric"))
    return pd.concat(frames, ignore_index=True).dropna(subset=["value"])


def per_class_long(s: Summary, results: RunResults, run: str) -> pd.DataFrame:
    """per_class.csv: one row per (run, method, seed, episode, class, split, metric): ``accuracy`` on test and on
    val (from results.json) and, with test predictions, ``precision`` and ``prediction_rate`` (#predicted / #test)
    on test, all in points of %; ``class_name`` beside the class index."""
    k = len(s.class_names)
    frames = []
    for m in s.methods:
        reps = _replicates(s, results, m)
        arrays = {("test", "accuracy"): s.acc[m],
                  ("val", "accuracy"): np.array([r.val_per_class_acc or [np.nan] * k for r in results.runs_of(m)],
                                                float)}
        if m in s.precision:
            arrays |= {("test", "precision"): s.precision[m], ("test", "prediction_rate"): s.pred_rate[m]}
        for (split, metric), a in arrays.items():
            df = pd.DataFrame(100 * np.asarray(a, dtype=float), columns=range(k)).join(reps)
            df = df.melt(id_vars=["seed", "episode"], var_name="class").assign(split=split, metric=metric)
            frames.append(df.assign(run=run, method=m))
    df = pd.concat(frames, ignore_index=True).dropna(subset=["value"])
    df["class"] = df["class"].astype(int)
    df.insert(0, "class_name", np.asarray(s.class_names, dtype=object)[df["class"]])
    return df[["run", "method", "seed", "episode", "class", "class_name", "split", "metric", "value"]]


def to_csv(s: Summary) -> str:
    """:meth:`Summary.frame` as CSV (:func:`to_csv_numbers`)."""
    return to_csv_numbers(s.frame().reset_index())


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                  "±": r"$\pm$", "Δ": r"$\Delta$", "—": "--", "−": "$-$", "γ": r"$\gamma$", "↑": r"$\uparrow$",
                  "↓": r"$\downarrow$", "α": r"$\alpha$", "√": r"$\surd$", "×": r"$\times$", "≥": r"$\geq$",
                  "–": "--", "<": "$<$", ">": "$>$"}


def latex_escape(text: str) -> str:
    """Escape LaTeX specials; ± → $\\pm$, Δ → $\\Delta$, em dash → --."""
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in str(text))


def _latex_cell(text: str) -> str:
    return latex_escape("−" + text[1:] if text.startswith("-") else text)  # a minus sign, not a hyphen


def to_latex(s: Summary) -> str:
    """A booktabs table (protocol columns, Δs and the instrument columns, no CIs) in a ``table`` float, rendered by
    pandas' ``Styler.to_latex``; the lines under the table (minimum detectable ΔHard, hard-set stability) in its
    caption; needs booktabs and graphicx."""
    text, bold = shown(s, COLUMNS + DELTA_COLUMNS + s.instrument_columns() + [Q_COLUMN, VERDICT_COLUMN])
    text, bold = text.reset_index(), bold.reset_index().assign(method=False)
    styler = (text.style.hide(axis="index").format(_latex_cell).format_index(latex_escape, axis=1)
              .apply(lambda d: bold.replace({True: "textbf:--rwrap;", False: ""}), axis=None))
    label = re.sub(r"[^A-Za-z0-9]+", "-", s.title).strip("-").lower()
    caption = (f"{latex_escape(s.title)}: {latex_escape(s.header())}; best per column in bold. "
               f"{latex_escape(' '.join(n + '.' for n in footnotes(s)))}")
    tex = styler.to_latex(hrules=True, column_format="l" + "r" * (len(text.columns) - 1), position="t",
                          position_float="centering", caption=caption, label=f"tab:{label}", environment="table")
    tex = tex.replace("\\begin{tabular}", "\\resizebox{\\linewidth}{!}{%\n\\begin{tabular}", 1)
    tex = tex.replace("\\end{tabular}", "\\end{tabular}}", 1)
    return "% mr2probe report table; needs \\usepackage{booktabs} and \\usepackage{graphicx}\n" + tex


def to_html_table(s: Summary) -> str:
    return html_table(*shown(s, table_columns(s)))


TERMINAL_WIDTH = 100  # the compact terminal table fits in this many characters


def terminal_table(s: Summary, width: int = TERMINAL_WIDTH, wide: bool = False) -> str:
    """The compact table (:data:`COMPACT`: All, Hard, Worst, ΔHard [95% CI], verdict, q) as plain text, best in
    bold, the minimum detectable ΔHard and the reference's warnings under it, then the :func:`legend`. All, Hard and
    Worst lose their "± SD" when the table would be wider than ``width``. ``wide``: every column of table.md
    (no width limit). The files keep every column."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    def render(cols: list[str], sd: bool) -> list[str]:
        text, bold = shown(s, cols, sd)
        table = Table(title=s.title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
        table.add_column("method", no_wrap=True)
        for c in cols:
            table.add_column(SHORT_NAMES.get(c, c), justify="left" if c == VERDICT_COLUMN else "right", no_wrap=True)
        for m in s.methods:
            table.add_row(m, *[f"[bold]{v}[/bold]" if b else v for v, b in zip(text.loc[m], bold.loc[m])],
                          style="dim" if m == s.null else None)
        console = Console(file=io.StringIO(), width=10_000, color_system=None, highlight=False)
        console.print(table)
        return [line.rstrip() for line in console.file.getvalue().splitlines()]

    if wide:
        lines = render(table_columns(s), True)
    else:
        lines = render(compact_columns(s), True)
        if max(map(len, lines[1:])) > width:
            lines = render(compact_columns(s), False)
    under_fit = reference_check_line(s) if (s.reference_check or {}).get("under_fit") else None
    notes = [x for x in (mde_line(s), reference_edge_warning(s), under_fit) if x]
    notes += legend(s, sd=wide or " ± " in "".join(lines))
    wrap = max(width, max(map(len, lines[1:])))
    for note in notes:
        lines += textwrap.wrap(note, wrap, subsequent_indent="  ")
    return "\n".join(lines) + "\n"


def to_html_confusions(s: Summary) -> str:
    """Where the hard classes' errors go: one row per hard class, one column for the reference and each method
    (the null control left out), each cell the class's accuracy and its top 3 confusions (count summed over
    seeds, share of the class's test images over seeds); collapsed in a ``<details>``. Empty without
    predictions."""
    methods = [m for m in s.methods if m in s.confusions and m != s.null]
    if s.reference in methods:
        methods.remove(s.reference)
        methods.insert(0, s.reference)
    if not methods or not s.confusions[methods[0]]:
        return ""

    def entry(e: dict[str, Any]) -> str:
        tops = "".join(f"<br>→ {html.escape(t['to'])}: {t['count']} ({100 * t['fraction']:.1f}%)" for t in e["top"])
        return f"acc {100 * e['accuracy']:.1f}%{tops or '<br>no errors'}"

    rows = [f"{html.escape(row['class'])} ({row['test_images']} images)" for row in s.confusions[methods[0]]]
    cells = pd.DataFrame({html.escape(m): [entry(e) for e in s.confusions[m]] for m in methods},
                         index=pd.Index(rows, name="hard class"))
    table = cells.to_html(escape=False, border=0).replace("<td>", "<td style='text-align:left'>")
    return ("<details><summary>Top confusions of the hard classes (test predictions; counts summed over seeds, "
            f"% of the class's test images over seeds)</summary><div style='overflow-x:auto'>{table}</div></details>")


# ---- one run -----------------------------------------------------------------------------------------------

@dataclass
class RunReport:
    """Everything written for one run folder."""

    run_dir: Path
    summary: Summary
    markdown: str
    plots: list[Path]
    notes: list[str]
    hard_classes: list[str]



def report_run(run_dir: str | Path, group_on: str = "val", plots: bool = False, html_file: bool = False,
               null: bool = True, margin: float = 1.0) -> RunReport:
    """Write table.md/.csv/.tex and summary.json (and, if asked, the PNG plots and report.html) into ``run_dir``;
    ``margin``: the equivalence margin of the verdicts (points)."""
    run_dir = Path(run_dir)
    results = load_results(run_dir)
    s = summarize(results, load_predictions(run_dir), group_on, null, margin)
    hard = [s.class_names[i] for i in s.groups.hard]
    md = to_markdown(s, protocol_link(run_dir)) + f"\nHard classes ({s.reference}, ranked on {group_on}"
    md += f", first half): {', '.join(hard)}; second half: " \
          f"{', '.join(s.class_names[i] for i in s.folds[1].groups.hard)}\n" if group_on == "crossfit" else \
        f"): {', '.join(hard)}\n"
    if not s.null and null:
        md += ("\nNo null control in this run (trained without one, or with --no-null): Δ columns have no "
               "'no effect' row to compare with.\n")
    atomic_text(run_dir / "table.md", md)
    atomic_text(run_dir / "table.csv", to_csv(s))
    atomic_text(run_dir / "table.tex", to_latex(s))
    atomic_text(run_dir / "metrics.csv", to_csv_numbers(metrics_long(s, results, run_dir.name)))
    atomic_text(run_dir / "per_class.csv", to_csv_numbers(per_class_long(s, results, run_dir.name)))
    atomic_json(run_dir / "summary.json", s.as_dict(), digits=SUMMARY_DIGITS)
    written, notes = [], []
    if plots:
        from .plots import write_plots

        written, notes = write_plots(s, results, run_dir)
    rep = RunReport(run_dir, s, md, written, notes, hard)
    if html_file:
        atomic_text(run_dir / "report.html", to_html([rep], where=run_dir))
    return rep


def clear_rendered(run_dir: str | Path) -> list[str]:
    """Delete what the report renders from results.json beyond the tables (the PNG plots, report.html): called when
    a run folder gets new results, so no page or plot of the old ones stays beside them. Returns the names
    deleted."""
    gone = []
    for name in PLOT_FILES + ["report.html"]:
        path = Path(run_dir) / name
        if path.is_file():
            path.unlink()
            gone.append(name)
    return gone


# ---- across runs -------------------------------------------------------------------------------------------

def run_labels(run_dirs: Sequence[Path]) -> list[str]:
    """Short unique names: each folder relative to the folders' common parent."""
    paths = [Path(d).resolve() for d in run_dirs]
    common = Path(os.path.commonpath(paths)) if paths else Path(".")
    labels = [str(p.relative_to(common)) if p != common else p.name for p in paths]
    return [lab if labels.count(lab) == 1 else str(p) for lab, p in zip(labels, paths)]


def stability_markdown(stability: dict[str, dict[str, Any]]) -> list[str]:
    """The block "hard-set stability across runs of the same dataset" (:func:`~mr2probe.summary.
    hard_set_stability`); no lines when no dataset has two runs."""
    if not stability:
        return []
    lines = ["", "**Hard-set stability across runs of the same dataset** — pairwise Jaccard |A ∩ B| / |A ∪ B| of "
             "the runs' hard sets (the reference's hard classes as each table ranks them; 1 = the same classes)", ""]
    for ds, st in stability.items():
        mean = f"{st['mean']:.2f}" if st["mean"] is not None else "n/a"
        pairs = "; ".join(f"{p['a']} vs {p['b']}: " + (f"{p['jaccard']:.2f}" if p["jaccard"] is not None else "n/a")
                          for p in st["pairs"])
        lines.append(f"- {ds}: mean {mean} over {len(st['runs'])} runs ({pairs})")
    return lines


CROSS_RUN_COLUMNS = ["All", "Hard", "Worst", "ΔAll", "ΔHard", "ΔEasy"]  # + the instruments, the ΔHard CI, q, verdicts


@dataclass
class CrossRun:
    """The summary across runs, as displayed cells: one table of every (run, method) row, one of each method's
    Δs averaged over runs, the minimum detectable ΔHard per run and the hard-set stability across runs. The
    numbers behind it are :func:`~mr2probe.summary.cross_run` and :func:`~mr2probe.summary.over_runs`."""

    runs: tuple[pd.DataFrame, pd.DataFrame]  # (text, bold), index [run, method]
    means: tuple[pd.DataFrame, pd.DataFrame]  # (text, bold), index method
    settings: dict[str, str]  # run label → title
    mde: dict[str, str]  # run label → the minimum-detectable line
    stability: dict[str, dict[str, Any]]
    numbers: pd.DataFrame  # summary.csv: cross_run rows (scope "run") then over_runs rows (scope "mean")

    HEADER = ("per run: mean ± sample SD over seeds (ddof = 1, points of %), Δ = method − the run's reference "
              f"paired by replicate; {RULE}; q: BH over the run's methods, q (all): BH over every method × run of "
              "this summary, each with its verdict of ΔHard (better / worse at q < 0.05, else equivalent by TOST "
              "at the run's margin, else inconclusive); best per column in bold within each run; `(null)` rows: the "
              "reference trained again on disjoint seeds (what no effect looks like). Averages: each method's "
              "replicate-mean Δ averaged over the runs that have it (± sample SD over runs) and how many runs give "
              "each verdict (all).")


def cross_run_summary(items: Sequence[tuple[str, Summary]]) -> CrossRun:
    """Build :class:`CrossRun` from labelled run summaries (the one summary behind report's and bench's
    summary.md)."""
    summaries = [s for _, s in items]
    instruments = list(dict.fromkeys(c for s in summaries for c in s.instrument_columns()))
    cols = CROSS_RUN_COLUMNS + instruments + (["ΔHard 95% CI"] if any(s.ci for s in summaries) else []) + [
        Q_COLUMN, VERDICT_COLUMN]
    texts, bolds = [], []
    for label, s in items:
        text, bold = shown(s, cols)
        for name, value in (("head", s.head), ("encoder", s.encoder), ("dataset", s.dataset)):
            text.insert(0, name, value)
            bold.insert(0, name, False)
        run = pd.Index([label] * len(text), name="run")
        texts.append(text.set_index(run, append=True).swaplevel())
        bolds.append(bold.set_index(run, append=True).swaplevel())
    text, bold = pd.concat(texts), pd.concat(bolds)
    numbers = cross_run(items)
    numbers.insert(numbers.columns.get_loc("encoder") + 1, "head", [s.head for _, s in items for _ in s.methods])
    q_all = numbers["ΔHard_q_all"].to_numpy(dtype=float)
    text["q (all)"] = ["" if not np.isfinite(q) else (f"{q:.3f}" if q >= 0.001 else "<0.001") for q in q_all]
    text["verdict (all)"] = numbers["ΔHard_verdict_all"].to_numpy()
    bold["q (all)"] = bold["verdict (all)"] = False
    means = over_runs(numbers)
    m_text = pd.DataFrame({"runs": means["runs"].astype(str)}, index=means.index)
    for c in DELTA_COLUMNS:
        m_text[c] = [_fmt(v, sd, True) for v, sd in zip(means[c], means[f"{c}_sd"])]
    for c in VERDICTS:
        if c in means:
            m_text[c] = means[c].astype(int).astype(str)
    nulls = {s.null for s in summaries if s.null}
    m_bold = pd.DataFrame({c: False for c in m_text.columns}, index=m_text.index)
    for c in DELTA_COLUMNS:
        best = best_of({m: v for m, v in means[c].items() if m not in nulls}, c)
        m_bold[c] = m_text.index.isin(list(best))
    csv_rows = pd.concat([numbers.assign(scope="run"),
                          means.reset_index().assign(scope="mean", run=f"mean over {len(items)} runs")],
                         ignore_index=True)
    csv_rows = csv_rows[["scope"] + [c for c in csv_rows.columns if c != "scope"]]
    csv_rows[["seeds", "runs"]] = csv_rows[["seeds", "runs"]].astype("Int64")
    return CrossRun((text, bold), (m_text, m_bold), {lab: s.title for lab, s in items},
                    {lab: mde_line(s) for lab, s in items}, hard_set_stability(items), csv_rows)


def cross_run_markdown(cr: CrossRun, links: dict[str, str] | None = None) -> str:
    """The summary across runs as markdown; ``links``: run label → the markdown shown in the run column."""
    text, bold = cr.runs
    if links:
        text = text.rename(index=links, level="run")
        bold = bold.rename(index=links, level="run")
    lines = [f"**Across runs** — {cr.HEADER}", ""]
    lines += [f"- `{run}`: {title}" for run, title in cr.settings.items()]
    lines += ["", markdown_table(text, bold), "", "Minimum detectable ΔHard per run:", ""]
    lines += [f"- `{run}`: {line.split(': ', 1)[1]}" for run, line in cr.mde.items()]
    lines += ["", f"**Averages over runs** (mean over {len(cr.settings)} runs at most; a method counts in the runs "
              "that have it)", "", markdown_table(*cr.means)]
    lines += stability_markdown(cr.stability)
    return "\n".join(lines) + "\n"


def to_csv_numbers(df: pd.DataFrame) -> str:
    """A numbers frame as CSV: ASCII column names (:func:`csv_name`), 4 decimals, never "-0.0000", empty cells
    where a value is undefined."""
    df = df.rename(columns=csv_name)
    num = df.select_dtypes("float").columns
    df[num] = df[num].round(4) + 0.0
    return df.to_csv(index=False, float_format="%.4f", lineterminator="\n")


def summary_paths(run_dirs: Sequence[Path], summary: Path | None) -> tuple[Path, Path]:
    """(markdown, csv) paths: PATH.md/PATH.csv, DIR/summary.md/.csv for an existing folder, default the run
    folders' common parent."""
    if summary is None:
        summary = Path(os.path.commonpath([Path(d).resolve() for d in run_dirs]))
    if summary.is_dir():
        return summary / "summary.md", summary / "summary.csv"
    if not summary.parent.is_dir():
        raise UserError(f"--summary {summary}: folder {summary.parent} does not exist")
    return summary.with_suffix(".md"), summary.with_suffix(".csv")


def html_figure(png: Path) -> str:
    """A PNG embedded in the page (base64), so the HTML file stands alone."""
    b64 = base64.b64encode(png.read_bytes()).decode("ascii")
    return f"<figure><img alt='{html.escape(png.name)}' src='data:image/png;base64,{b64}'></figure>"


HTML_CSS = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}"
            "table{border-collapse:collapse;font-size:13px;margin:.5em 0}"
            "td,th{border:1px solid #ccc;padding:3px 7px;text-align:right;white-space:nowrap}"
            "th{position:sticky;top:0;background:#f3f3f3;z-index:1}td:first-child,th:first-child{text-align:left}"
            ".wide{max-height:80vh;overflow:auto;border:1px solid #eee}.wide table{margin:0}"
            ".legend{color:#444;font-size:13px;line-height:1.5}.note{color:#a60}details{margin:.6em 0}"
            "summary{cursor:pointer;color:#235}img{max-width:100%;border:1px solid #eee;margin:.5em 0}"
            ".v-better{color:#17692e;font-weight:600}.v-worse{color:#b01c1c;font-weight:600}"
            ".v-equivalent{color:#1d4f91}.v-inconclusive{color:#8a6d00}.v-identical{color:#555}"
            ".v-underpowered{color:#8a4f00}")


def _details(summary: str, body: str) -> str:
    return f"<details><summary>{html.escape(summary)}</summary>{body}</details>"


def html_run(rep: RunReport, link: str | None) -> str:
    """One run's section: the compact table with its legend and warnings, every column and the notes collapsed,
    the hard classes, their top confusions, notes and plots."""
    s = rep.summary
    warn = [x for x in (mde_line(s), reference_edge_warning(s), grid_edge_line(s),
                        reference_check_line(s) if (s.reference_check or {}).get("under_fit") else None) if x]
    wide = f"<div class='wide'>{to_html_table(s)}</div>"
    notes = "".join(f"<p>{html_text(n)}</p>" for n in footnotes(s) + [f"How this table was made: {s.header()}"])
    return (f"<h2>{html.escape(s.title)}</h2><p class='legend'>"
            + "<br>".join(html_text(x) for x in legend(s, link)) + "</p>"
            + html_table(*shown(s, compact_columns(s)))
            + "".join(f"<p>{html_text(w)}</p>" for w in warn)
            + _details(f"Every column ({len(table_columns(s))}; best per column in bold)", wide)
            + _details("How the table was made, and every note under it", notes)
            + f"<p>Run folder <code>{html.escape(str(rep.run_dir))}</code>. Hard classes: "
              f"{html.escape(', '.join(rep.hard_classes))}</p>{to_html_confusions(s)}"
            + "".join(f"<p class='note'>{html.escape(n)}</p>" for n in rep.notes)
            + "".join(html_figure(p) for p in rep.plots))


def to_html(reports: Sequence[RunReport], cross: CrossRun | None = None, cross_plots: Sequence[Path] = (),
            where: Path | None = None) -> str:
    """One self-contained HTML page: optional summary across runs (the hard-set stability across runs and the
    ``cross_plots``, e.g. summary.png), then per run its compact table (:func:`html_run`); ``where``: the folder
    the page is written to (for the link to the protocol page)."""
    link = protocol_link(where)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>mr2probe report</title><style>{HTML_CSS}"
             "</style></head><body><h1>mr2probe report</h1>"]
    if cross is not None:
        parts.append(f"<h2>Across runs</h2><p class='legend'>{html_text(CrossRun.HEADER)}</p>"
                     f"<div class='wide'>{html_table(*cross.runs)}</div>"
                     f"<h3>Averages over runs</h3>{html_table(*cross.means)}<ul>"
                     + "".join(f"<li>{html.escape(run)}: {html.escape(line)}</li>" for run, line in cross.mde.items())
                     + "</ul>")
        block = stability_markdown(cross.stability)
        if block:
            parts.append(f"<p>{html.escape(block[1].replace('**', ''))}</p><ul>"
                         + "".join(f"<li>{html.escape(x[2:])}</li>" for x in block[3:]) + "</ul>")
        parts += [html_figure(p) for p in cross_plots]
    parts += [html_run(rep, link) for rep in reports]
    parts.append("</body></html>\n")
    return "".join(parts)


def run_report(run_dirs: Sequence[str | Path], group_on: str = "val", summary: str | Path | None = None,
               html_file: bool = False, plots: bool = True, null: bool = True, margin: float = 1.0,
               wide: bool = False) -> str:
    """The ``mr2probe report`` command: per-run files, then (several runs or ``summary`` given) the summary across
    runs. Returns the text to print: each run's compact table (:func:`terminal_table`) and what was written. With
    ``html_file``: one run → RUN_DIR/report.html; several → report.html beside the summary files, holding the
    summary and every run."""
    dirs = [Path(d) for d in run_dirs]
    for d in dirs:  # fail before writing anything
        load_results(d)
    reports = [report_run(d, group_on, plots, html_file and len(dirs) == 1, null, margin) for d in dirs]
    out = []
    for rep in reports:
        out += [terminal_table(rep.summary, wide=wide).rstrip("\n")] + rep.notes
        names = RUN_FILES + [p.name for p in rep.plots]
        names += ["report.html"] if html_file and len(dirs) == 1 else []
        out.append(f"wrote {rep.run_dir}/{{{','.join(names)}}}")
        out.append("")
    if len(dirs) > 1 or summary is not None:
        cross = cross_run_summary(list(zip(run_labels(dirs), (rep.summary for rep in reports))))
        md_path, csv_path = summary_paths(dirs, Path(summary) if summary is not None else None)
        atomic_text(md_path, cross_run_markdown(cross))
        atomic_text(csv_path, to_csv_numbers(cross.numbers))
        out += ["Averages over runs (Δ to each run's reference; per-run rows in the summary file):",
                markdown_table(*cross.means), f"wrote {md_path} and {csv_path}"]
        cross_plots = []
        if plots:
            from .plots import plot_across_runs

            png, _ = plot_across_runs(cross.numbers[cross.numbers["scope"] == "run"], md_path.with_suffix(".png"))
            cross_plots.append(png)
            out.append(f"wrote {png}")
        if html_file:
            html_path = md_path.parent / "report.html"
            atomic_text(html_path, to_html(reports, cross, cross_plots, html_path.parent))
            out.append(f"wrote {html_path}")
    return "\n".join(out)
