"""The report stage: results.json (+ predictions.npz) → the protocol table, as markdown and CSV.

Groups come from the reference method (default ce) averaged over seeds, and are the same for every method.
Each column is mean ± std over seeds; Δ columns are the method's mean minus the reference's mean (std over
seeds of the per-seed paired differences). CIs are 95% bootstrap intervals over test samples (1000 draws,
seed 0), computed per seed and averaged over seeds.
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import UserError
from .metrics import COLUMNS, DELTA_COLUMNS, Groups, bootstrap_all_hard, class_groups, disparity_row

CI_COLUMNS = ["All 95% CI", "Hard 95% CI", "ΔAll 95% CI", "ΔHard 95% CI"]


@dataclass
class Summary:
    """The table's content: per method, mean and std of every column, and CIs."""

    methods: list[str]
    reference: str
    groups: Groups
    mean: dict[str, dict[str, float]]
    std: dict[str, dict[str, float]]
    ci: dict[str, dict[str, list[float]]]
    seeds: dict[str, list[int]]
    title: str

    def as_dict(self) -> dict[str, Any]:
        return {"title": self.title, "reference": self.reference, "groups": self.groups.as_dict(),
                "mean": self.mean, "std": self.std, "ci": self.ci, "seeds": self.seeds}


def load_results(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / "results.json"
    if not path.is_file():
        raise UserError(f"{path} not found: run `mr2probe train --out {run_dir}` first")
    try:
        results = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({e}); train again") from None
    if not isinstance(results, dict) or not results.get("runs"):
        raise UserError(f"{path} holds no runs")
    return results


def load_predictions(run_dir: str | Path) -> dict[str, np.ndarray] | None:
    from .experiment import load_npz

    path = Path(run_dir) / "predictions.npz"
    return load_npz(path) if path.is_file() else None


def summarize(results: dict[str, Any], predictions: dict[str, np.ndarray] | None = None,
              group_on: str = "test") -> Summary:
    """Groups from the reference, then every column per method (mean ± std over seeds) and CIs."""
    by_method: dict[str, list[dict[str, Any]]] = {}
    for run in results["runs"]:
        by_method.setdefault(run["method"], []).append(run)
    reference = results.get("reference") or next(iter(by_method))
    if reference not in by_method:
        raise UserError(f"reference method {reference!r} is not among the runs ({', '.join(by_method)})")
    key = "per_class_acc" if group_on == "test" else "val_per_class_acc"
    ref_runs = sorted(by_method[reference], key=lambda r: r["seed"])
    groups = class_groups(np.mean([r[key] for r in ref_runs], axis=0))
    counts = np.asarray(results["test_class_counts"], dtype=float)
    ref_rows = {r["seed"]: disparity_row(np.asarray(r["per_class_acc"]), groups, counts) for r in ref_runs}
    mean, std, ci, seeds = {}, {}, {}, {}
    y = predictions.get("test_labels") if predictions else None
    k = len(results["class_names"])
    for method, runs in by_method.items():
        runs = sorted(runs, key=lambda r: r["seed"])
        rows = [disparity_row(np.asarray(r["per_class_acc"]), groups, counts) for r in runs]
        cols = {c: np.array([row[c] for row in rows]) for c in COLUMNS}
        for d, c in zip(DELTA_COLUMNS, ("Hard", "Easy", "All")):
            cols[d] = np.array([row[c] - ref_rows[r["seed"]][c] if r["seed"] in ref_rows else np.nan
                                for row, r in zip(rows, runs)])
        mean[method] = {c: float(np.nanmean(v)) for c, v in cols.items()}
        std[method] = {c: float(np.nanstd(v)) for c, v in cols.items()}
        seeds[method] = [r["seed"] for r in runs]
        if y is not None and all(f"{method}/{r['seed']}" in predictions for r in runs):
            per_seed = [bootstrap_all_hard(predictions[f"{method}/{r['seed']}"], y, groups.hard, k,
                                           ref_pred=predictions.get(f"{reference}/{r['seed']}"))
                        for r in runs]
            ci[method] = {name: np.mean([p[name] for p in per_seed], axis=0).tolist()
                          for name in per_seed[0]}
    prov = results.get("provenance", {})
    title = f"{prov.get('encoder', '?')} on {prov.get('dataset', '?')}, {results.get('head', '?')} head, " \
            f"adapter {results.get('adapter', 'none')}"
    return Summary(list(by_method), reference, groups, mean, std, ci, seeds, title)


def _cell(s: Summary, method: str, col: str) -> str:
    if method == s.reference and col.startswith("Δ"):
        return "—"
    if col in CI_COLUMNS:
        v = s.ci.get(method, {}).get(col.replace(" 95% CI", ""))
        return f"[{v[0]:.1f}, {v[1]:.1f}]" if v else ""
    m, sd = s.mean[method][col], s.std[method][col]
    sign = "+" if col in DELTA_COLUMNS and m > 0 else ""
    return f"{sign}{m:.2f} ± {sd:.2f}"


def table_columns(s: Summary) -> list[str]:
    return COLUMNS + DELTA_COLUMNS + (CI_COLUMNS if s.ci else [])


def to_markdown(s: Summary) -> str:
    cols = table_columns(s)
    lines = [f"**{s.title}** — mean ± std over seeds (%), groups from {s.reference}",
             "", "| method | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for m in s.methods:
        lines.append(f"| {m} | " + " | ".join(_cell(s, m, c) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def to_csv(s: Summary) -> str:
    """One row per method: ``method``, the protocol's columns (means), then ``<col>_std`` and CI bounds."""
    buf = io.StringIO()
    w = csv.writer(buf)
    cols = COLUMNS + DELTA_COLUMNS
    ci_names = ["All", "Hard", "ΔAll", "ΔHard"] if s.ci else []
    w.writerow(["method"] + cols + [f"{c}_std" for c in cols] + ["seeds"]
               + [f"{c}_ci_{b}" for c in ci_names for b in ("lo", "hi")])
    for m in s.methods:
        cis = [f"{v:.4f}" for c in ci_names for v in s.ci.get(m, {}).get(c, [float("nan")] * 2)]
        w.writerow([m] + [f"{s.mean[m][c]:.4f}" for c in cols] + [f"{s.std[m][c]:.4f}" for c in cols]
                   + [len(s.seeds[m])] + cis)
    return buf.getvalue()


def write_report(run_dir: str | Path, group_on: str = "test") -> str:
    """Rebuild table.md, table.csv and summary.json in ``run_dir`` from its results; return the markdown."""
    if group_on not in ("test", "val"):
        raise UserError(f"--groups-on must be test or val, got {group_on!r}")
    from .experiment import atomic_json, _atomic_write

    run_dir = Path(run_dir)
    results = load_results(run_dir)
    s = summarize(results, load_predictions(run_dir), group_on)
    md = to_markdown(s)
    hard = ", ".join(results["class_names"][i] for i in s.groups.hard)
    md += f"\nHard classes ({s.reference}): {hard}\n"
    _atomic_write(run_dir / "table.md", lambda p: p.write_text(md))
    _atomic_write(run_dir / "table.csv", lambda p: p.write_text(to_csv(s)))
    atomic_json(run_dir / "summary.json", s.as_dict())
    return md
