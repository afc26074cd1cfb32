"""The report stage: results.json (+ predictions.npz) → the protocol table (markdown, CSV, LaTeX), plots, HTML,
and a Δ summary across runs.

Groups come from the reference method (default ce) averaged over seeds and are the same for every method; they are
ranked on val by default (``--groups-on val|crossfit|test``, :data:`~mr2probe.metrics.GROUPS_ON`). Each column is
mean ± sample SD (ddof = 1) over seeds; Δ columns are paired seed by seed with the reference. The null control
(``<reference> (null)``: the reference trained again on disjoint seeds) is a row like any method: its Δs and CIs
show what "no effect" looks like. CIs are 95% bootstrap intervals of the seed mean (:class:`~mr2probe.metrics.
Bootstrap`: 1000 draws of test images, seed 0, shared by seeds and methods). The best value of each column (as
displayed, 2 decimals; ties all marked; neither the null control nor, in Δ columns, the reference is a
candidate) is bold: highest for accuracies, Δs and HardPrec, lowest for Std and Gap.

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
import csv
import html
import io
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .atomic import atomic_text
from .errors import UserError
from .metrics import COLUMNS, DELTA_COLUMNS, SIG_COLUMN
from .summary import Summary, best_of, hard_set_stability, sample_sd, summarize

CI_COLUMNS = ["All 95% CI", "Hard 95% CI", "ΔHard 95% CI", "ΔEasy 95% CI", "ΔAll 95% CI"]
PLOT_FILES = ["per_class.png", "groups.png", "variability.png", "tradeoff.png"]


def load_results(run_dir: str | Path) -> dict[str, Any]:
    """Read and sanity-check ``RUN_DIR/results.json``; every problem is a one-line :class:`UserError`."""
    path = Path(run_dir) / "results.json"
    if not path.is_file():
        raise UserError(f"{path} not found: run `mr2probe train --out {run_dir}` first")
    try:
        results = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({e}); train again") from None
    if not isinstance(results, dict) or not results.get("runs"):
        raise UserError(f"{path} holds no runs")
    try:
        k = len(results["class_names"])
        if len(results["test_class_counts"]) != k:
            raise ValueError("test_class_counts and class_names differ in length")
        for r in results["runs"]:
            if len(r["per_class_acc"]) != k or not isinstance(r["seed"], int) or not isinstance(r["method"], str):
                raise ValueError(f"run {r.get('method')}/{r.get('seed')} has a malformed per_class_acc/seed/method")
    except (KeyError, TypeError, ValueError) as e:
        what = f"missing field {e}" if isinstance(e, KeyError) else str(e)
        raise UserError(f"{path} is not a mr2probe results file ({what}); train again") from None
    return results


def load_predictions(run_dir: str | Path) -> dict[str, np.ndarray] | None:
    """predictions.npz as written by ``experiment.atomic_npz`` ("/" in keys stored as "__"), or None.
    Read here rather than with ``experiment.load_npz`` so that reporting does not import torch."""
    path = Path(run_dir) / "predictions.npz"
    if not path.is_file():
        return None
    try:
        with np.load(path) as z:
            return {k.replace("__", "/"): z[k] for k in z.files}
    except (OSError, ValueError) as e:
        raise UserError(f"{path} is unreadable ({e}); train again or delete it to report without CIs") from None


# ---- tables ------------------------------------------------------------------------------------------------

def _fmt(m: float, sd: float, signed: bool) -> str:
    """"m ± sd" with 2 decimals; no "-0.00"; no "± nan" (one seed)."""
    m = 0.0 if abs(m) < 0.005 else m
    text = f"{'+' if signed and m > 0 else ''}{m:.2f}"
    return text if not np.isfinite(sd) else f"{text} ± {sd:.2f}"


def _num(v: float) -> str:
    """A CSV number: 4 decimals, never "-0.0000"."""
    return f"{round(v, 4) + 0.0:.4f}"


def _cell(s: Summary, method: str, col: str) -> str:
    if method == s.reference and (col.startswith("Δ") or col == SIG_COLUMN):
        return "—"
    if col in CI_COLUMNS:
        v = s.ci.get(method, {}).get(col.replace(" 95% CI", ""))
        return f"[{v[0]:.1f}, {v[1]:.1f}]" if v else ""
    if col == SIG_COLUMN:
        counts = s.sig_counts(method)
        return f"{counts[0]} / {counts[1]}" if counts else ""
    if col not in s.mean[method]:  # an instrument column of a method without test predictions
        return ""
    return _fmt(s.mean[method][col], s.std[method][col], col in DELTA_COLUMNS)


def cell(s: Summary, method: str, col: str) -> str:
    """One displayed cell of any table column (also for bench's summary.md)."""
    return _cell(s, method, col)


def numeric_columns(s: Summary) -> list[str]:
    """The mean ± SD columns: the protocol's, the Δs, and the instruments this run has (HardPrec, HardRate)."""
    return COLUMNS + DELTA_COLUMNS + [c for c in s.instrument_columns() if c != SIG_COLUMN]


def table_columns(s: Summary) -> list[str]:
    return COLUMNS + DELTA_COLUMNS + s.instrument_columns() + (CI_COLUMNS if s.ci else [])


def footnotes(s: Summary) -> list[str]:
    """The lines printed under every table: the minimum detectable ΔHard, the stability of the hard set over
    the reference's seeds, and what the instrument columns mean (or that they need predictions)."""
    lines = []
    if s.mde is not None and np.isfinite(s.mde["value"]):
        lines.append(f"Minimum detectable ΔHard (80% power, α = 0.05): {s.mde['value']:.2f} points "
                     f"({s.mde['describe']})")
    else:
        lines.append("Minimum detectable ΔHard (80% power, α = 0.05): not available (needs 2 seeds or "
                     "predictions.npz, and hard classes)")
    st = s.seed_stability
    if st.get("value") is not None:
        lines.append(f"Hard-set stability across seeds ({s.reference}, each seed ranked on its own {st['ranked_on']} "
                     f"accuracy): mean pairwise Jaccard {st['value']:.2f} over {st['seeds']} seeds "
                     f"({st['pairs']} pair{'s' * (st['pairs'] != 1)})")
    else:
        why = "one seed" if st.get("seeds", 0) < 2 else "no hard classes"
        lines.append(f"Hard-set stability across seeds ({s.reference}): not available ({why})")
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


def to_markdown(s: Summary) -> str:
    cols = table_columns(s)
    best = {c: s.best(c) for c in cols}
    lines = [f"**{s.title}** — {s.header()}; best per column in bold",
             "", "| method | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for m in s.methods:
        cells = [f"**{_cell(s, m, c)}**" if m in best[c] else _cell(s, m, c) for c in cols]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines += [""] + footnotes(s)
    return "\n".join(lines) + "\n"


def to_csv(s: Summary) -> str:
    """One row per method: ``method``, the protocol's columns (means; with predictions also HardPrec and
    HardRate), then ``<col>_sd``, seeds, groups_on, with predictions ``Sig↑`` / ``Sig↓`` (empty for the
    reference) and the CI bounds. A method without predictions has empty instrument cells."""
    buf = io.StringIO()
    w = csv.writer(buf)
    cols = numeric_columns(s)
    sig = ["Sig↑", "Sig↓"] if SIG_COLUMN in s.instrument_columns() else []
    ci_names = [c.removesuffix(" 95% CI") for c in CI_COLUMNS] if s.ci else []
    w.writerow(["method"] + cols + [f"{c}_sd" for c in cols] + ["seeds", "groups_on"] + sig
               + [f"{c}_ci_{b}" for c in ci_names for b in ("lo", "hi")])
    for m in s.methods:
        cis = [_num(v) for c in ci_names for v in s.ci.get(m, {}).get(c, [float("nan")] * 2)]
        counts = [str(x) for x in s.sig_counts(m) or ("", "")] if sig else []
        w.writerow([m] + [_num(s.mean[m][c]) if c in s.mean[m] else "" for c in cols]
                   + [_num(s.std[m][c]) if c in s.std[m] else "" for c in cols]
                   + [len(s.seeds[m]), s.group_on] + counts + cis)
    return buf.getvalue()


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                  "±": r"$\pm$", "Δ": r"$\Delta$", "—": "--", "−": "$-$", "γ": r"$\gamma$", "↑": r"$\uparrow$",
                  "↓": r"$\downarrow$", "α": r"$\alpha$", "√": r"$\surd$", "×": r"$\times$", "≥": r"$\geq$",
                  "–": "--", "<": "$<$", ">": "$>$"}


def latex_escape(text: str) -> str:
    """Escape LaTeX specials; ± → $\\pm$, Δ → $\\Delta$, em dash → --."""
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text)


def to_latex(s: Summary) -> str:
    """A booktabs table (protocol columns, Δs and the instrument columns, no CIs) in a ``table`` float, the lines
    under the table (minimum detectable ΔHard, hard-set stability) in its caption; needs booktabs and graphicx."""
    cols = COLUMNS + DELTA_COLUMNS + s.instrument_columns()
    best = {c: s.best(c) for c in cols}

    def cell(m: str, c: str) -> str:
        text = _cell(s, m, c)
        text = latex_escape("−" + text[1:] if text.startswith("-") else text)  # − → $-$
        return rf"\textbf{{{text}}}" if m in best[c] else text

    label = re.sub(r"[^A-Za-z0-9]+", "-", s.title).strip("-").lower()
    lines = [r"% mr2probe report table; needs \usepackage{booktabs} and \usepackage{graphicx}",
             r"\begin{table}[t]", r"\centering",
             rf"\caption{{{latex_escape(s.title)}: {latex_escape(s.header())}; best per column in bold. "
             rf"{latex_escape(' '.join(n + '.' for n in footnotes(s)))}}}",
             rf"\label{{tab:{label}}}", r"\resizebox{\linewidth}{!}{%",
             r"\begin{tabular}{l" + "r" * len(cols) + "}", r"\toprule",
             "method & " + " & ".join(latex_escape(c) for c in cols) + r" \\", r"\midrule"]
    lines += [latex_escape(m) + " & " + " & ".join(cell(m, c) for c in cols) + r" \\" for m in s.methods]
    lines += [r"\bottomrule", r"\end{tabular}}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def to_html_table(s: Summary) -> str:
    cols = table_columns(s)
    best = {c: s.best(c) for c in cols}
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ["method"] + cols)
    rows = "".join("<tr><th>" + html.escape(m) + "</th>" + "".join(
        f"<td><b>{html.escape(_cell(s, m, c))}</b></td>" if m in best[c] else f"<td>{html.escape(_cell(s, m, c))}</td>"
        for c in cols) + "</tr>" for m in s.methods)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


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
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ["hard class"] + methods)

    def entry(e: dict[str, Any]) -> str:
        tops = "".join(f"<br>→ {html.escape(t['to'])}: {t['count']} ({100 * t['fraction']:.1f}%)" for t in e["top"])
        return f"<td style='text-align:left'>acc {100 * e['accuracy']:.1f}%{tops or '<br>no errors'}</td>"

    body = "".join(f"<tr><th>{html.escape(row['class'])} ({row['test_images']} images)</th>"
                   + "".join(entry(s.confusions[m][i]) for m in methods) + "</tr>"
                   for i, row in enumerate(s.confusions[methods[0]]))
    return ("<details><summary>Top confusions of the hard classes (test predictions; counts summed over seeds, "
            "% of the class's test images over seeds)</summary><div style='overflow-x:auto'>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div></details>")


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
               null: bool = True) -> RunReport:
    """Write table.md/.csv/.tex and summary.json (and, if asked, the PNG plots and report.html) into ``run_dir``."""
    run_dir = Path(run_dir)
    results = load_results(run_dir)
    s = summarize(results, load_predictions(run_dir), group_on, null)
    hard = [s.class_names[i] for i in s.groups.hard]
    md = to_markdown(s) + f"\nHard classes ({s.reference}, ranked on {group_on}"
    md += f", first half): {', '.join(hard)}; second half: " \
          f"{', '.join(s.class_names[i] for i in s.folds[1].groups.hard)}\n" if group_on == "crossfit" else \
        f"): {', '.join(hard)}\n"
    if not s.null and null:
        md += ("\nNo null control in this run (trained without one, or with --no-null): Δ columns have no "
               "'no effect' row to compare with.\n")
    atomic_text(run_dir / "table.md", md)
    atomic_text(run_dir / "table.csv", to_csv(s))
    atomic_text(run_dir / "table.tex", to_latex(s))
    atomic_text(run_dir / "summary.json", json.dumps(s.as_dict(), indent=1, default=str) + "\n")
    written, notes = [], []
    if plots:
        from .plots import write_plots

        written, notes = write_plots(s, results, run_dir)
    rep = RunReport(run_dir, s, md, written, notes, hard)
    if html_file:
        atomic_text(run_dir / "report.html", to_html([rep]))
    return rep


def write_report(run_dir: str | Path, group_on: str = "val", plots: bool = False, html_file: bool = False,
                 null: bool = True) -> str:
    """Rebuild the tables (and optionally plots / report.html) in ``run_dir``; return the markdown."""
    return report_run(run_dir, group_on, plots, html_file, null).markdown


# ---- across runs -------------------------------------------------------------------------------------------

def run_labels(run_dirs: Sequence[Path]) -> list[str]:
    """Short unique names: each folder relative to the folders' common parent."""
    paths = [Path(d).resolve() for d in run_dirs]
    common = Path(os.path.commonpath(paths)) if paths else Path(".")
    labels = [str(p.relative_to(common)) if p != common else p.name for p in paths]
    return [lab if labels.count(lab) == 1 else str(p) for lab, p in zip(labels, paths)]


def combine(reports: Sequence[tuple[str, Summary]]) -> list[dict[str, Any]]:
    """Δ rows: one per (run, non-reference method) with mean/std over seeds (``scope`` "run", ``n`` = seeds),
    then one per method averaged over the runs that have it (``scope`` "mean", std over runs, ``n`` = runs)."""
    rows: list[dict[str, Any]] = []
    for label, s in reports:
        for m in s.methods:
            if m != s.reference:
                rows.append({"scope": "run", "run": label, "setting": s.title, "reference": s.reference, "method": m,
                             "n": len(s.seeds[m]), **{c: s.mean[m][c] for c in DELTA_COLUMNS},
                             **{f"{c}_std": s.std[m][c] for c in DELTA_COLUMNS}})
    methods = list(dict.fromkeys(r["method"] for r in rows))
    for m in methods:
        mine = [r for r in rows if r["method"] == m and r["scope"] == "run"]
        vals = np.array([[r[c] for c in DELTA_COLUMNS] for r in mine])  # [runs, 3]
        rows.append({"scope": "mean", "run": f"mean over {len(mine)} run{'s' * (len(mine) > 1)}", "setting": "",
                     "reference": ",".join(dict.fromkeys(r["reference"] for r in mine)), "method": m, "n": len(mine),
                     **dict(zip(DELTA_COLUMNS, np.nanmean(vals, 0).tolist())),
                     **{f"{c}_std": sample_sd(vals[:, i]) for i, c in enumerate(DELTA_COLUMNS)}})
    return rows


def _combined_bold(rows: list[dict[str, Any]]) -> list[set[str]]:
    """Per row, the Δ columns in which its method is best within its block (its run, or the averages)."""
    best = {}
    for block in dict.fromkeys(r["run"] for r in rows):
        mine = [r for r in rows if r["run"] == block]
        best[block] = {c: best_of({r["method"]: r[c] for r in mine if not r["method"].endswith(" (null)")}, c)
                       for c in DELTA_COLUMNS}
    return [{c for c in DELTA_COLUMNS if r["method"] in best[r["run"]][c]} for r in rows]


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


def combined_markdown(rows: list[dict[str, Any]], settings: dict[str, str],
                      stability: dict[str, dict[str, Any]] | None = None) -> str:
    """The Δ summary as markdown; best per column in bold within each run and within the averages; with
    ``stability`` (:func:`~mr2probe.summary.hard_set_stability`) the hard-set stability block under it."""
    lines = ["**Δ to the reference across runs** — per run: mean ± sample SD over seeds; averages: mean ± sample SD "
             "over runs (points of %); best per column in bold within each block; `(null)` rows: the reference "
             "trained again on disjoint seeds (what no effect looks like)", ""]
    lines += [f"- `{run}`: {title}" for run, title in settings.items()]
    lines += ["", "| run | method | reference | " + " | ".join(DELTA_COLUMNS) + " |",
              "|---" * (3 + len(DELTA_COLUMNS)) + "|"]
    for r, bold in zip(rows, _combined_bold(rows)):
        cells = [_fmt(r[c], r[f"{c}_std"], True) for c in DELTA_COLUMNS]
        cells = [f"**{x}**" if c in bold else x for x, c in zip(cells, DELTA_COLUMNS)]
        lines.append(f"| {r['run']} | {r['method']} | {r['reference']} | " + " | ".join(cells) + " |")
    lines += stability_markdown(stability or {})
    return "\n".join(lines) + "\n"


def combined_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    keys = ["scope", "run", "setting", "reference", "method", "n"] + DELTA_COLUMNS + [f"{c}_std" for c in DELTA_COLUMNS]
    w = csv.DictWriter(buf, keys)
    w.writeheader()
    for r in rows:
        w.writerow({k: _num(r[k]) if isinstance(r[k], float) else r[k] for k in keys})
    return buf.getvalue()


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


def to_html(reports: Sequence[RunReport], combined_rows: list[dict[str, Any]] | None = None,
            stability: dict[str, dict[str, Any]] | None = None) -> str:
    """One self-contained HTML page: optional Δ summary (and hard-set stability across runs), then per run its
    table, the lines under it, the hard classes' top confusions, notes and plots (base64 PNG)."""
    css = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;"
           "font-size:13px;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}"
           "th:first-child{text-align:left}img{max-width:100%;border:1px solid #eee;margin:.5em 0}"
           ".note{color:#a60}")
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>mr2probe report</title><style>{css}</style>"
             "</head><body><h1>mr2probe report</h1>"]
    if combined_rows:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in ["run", "method", "reference"] + DELTA_COLUMNS)
        def td(text: str, bold: bool = False) -> str:
            return f"<td><b>{html.escape(text)}</b></td>" if bold else f"<td>{html.escape(text)}</td>"

        body = "".join("<tr>" + "".join(td(str(r[c])) for c in ("run", "method", "reference"))
                       + "".join(td(_fmt(r[c], r[f"{c}_std"], True), c in bold) for c in DELTA_COLUMNS) + "</tr>"
                       for r, bold in zip(combined_rows, _combined_bold(combined_rows)))
        parts.append("<h2>Δ to the reference across runs</h2><p>Per run: mean ± sample SD over seeds; averages: mean "
                     "± sample SD over runs (points of %); best per column in bold within each block.</p>"
                     f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
    block = stability_markdown(stability or {})
    if block:
        parts.append(f"<p>{html.escape(block[1].replace('**', ''))}</p><ul>"
                     + "".join(f"<li>{html.escape(x[2:])}</li>" for x in block[3:]) + "</ul>")
    for rep in reports:
        s = rep.summary
        parts.append(f"<h2>{html.escape(s.title)}</h2><p>Run folder <code>{html.escape(str(rep.run_dir))}</code>; "
                     f"{html.escape(s.header())}; best per column in bold.</p>{to_html_table(s)}"
                     + "".join(f"<p>{html.escape(n)}</p>" for n in footnotes(s))
                     + f"<p>Hard classes: {html.escape(', '.join(rep.hard_classes))}</p>{to_html_confusions(s)}")
        parts += [f"<p class='note'>{html.escape(n)}</p>" for n in rep.notes]
        for p in rep.plots:
            b64 = base64.b64encode(p.read_bytes()).decode("ascii")
            parts.append(f"<figure><img alt='{html.escape(p.name)}' src='data:image/png;base64,{b64}'></figure>")
    parts.append("</body></html>\n")
    return "".join(parts)


def run_report(run_dirs: Sequence[str | Path], group_on: str = "val", summary: str | Path | None = None,
               html_file: bool = False, plots: bool = True, null: bool = True) -> str:
    """The ``mr2probe report`` command: per-run files, then (several runs or ``summary`` given) the Δ summary.
    Returns the text to print. With ``html_file``: one run → RUN_DIR/report.html; several → report.html beside
    the summary files, holding the summary and every run."""
    dirs = [Path(d) for d in run_dirs]
    for d in dirs:  # fail before writing anything
        load_results(d)
    reports = [report_run(d, group_on, plots, html_file and len(dirs) == 1, null) for d in dirs]
    out = []
    for rep in reports:
        out += [rep.markdown.rstrip("\n")] + rep.notes
        names = ["table.md", "table.csv", "table.tex", "summary.json"] + [p.name for p in rep.plots]
        names += ["report.html"] if html_file and len(dirs) == 1 else []
        out.append(f"wrote {rep.run_dir}/{{{','.join(names)}}}")
        out.append("")
    if len(dirs) > 1 or summary is not None:
        labels = run_labels(dirs)
        rows = combine([(lab, rep.summary) for lab, rep in zip(labels, reports)])
        stability = hard_set_stability([(lab, rep.summary) for lab, rep in zip(labels, reports)])
        md = combined_markdown(rows, {lab: rep.summary.title for lab, rep in zip(labels, reports)}, stability)
        md_path, csv_path = summary_paths(dirs, Path(summary) if summary is not None else None)
        atomic_text(md_path, md)
        atomic_text(csv_path, combined_csv(rows))
        out += [md, f"wrote {md_path} and {csv_path}"]
        if html_file:
            html_path = md_path.parent / "report.html"
            atomic_text(html_path, to_html(reports, rows, stability))
            out.append(f"wrote {html_path}")
    return "\n".join(out)
