"""Every method × cell comparison of the committed study in one Benjamini–Hochberg family.

    python benchmarks/study_verdicts.py results [--out results/study-verdicts]

Reads the per-run rows of every ``results/<folder>/summary.csv`` (written by ``mr2probe bench … --report-only``:
one row per run and method, with the run's ΔHard, its two-stage p and TOST p_equiv), puts every comparison with a
run's reference (neither the reference nor its null control) into one family, and writes
``OUT.csv`` (every row with ``ΔHard_q_study`` and ``ΔHard_verdict_study``) and ``OUT.md`` (per method and
reference: how many cells give each verdict, and the cells where it is better or worse). The null controls are
counted apart: how many of their ΔHard CIs exclude 0. The positive control (features altered on purpose) is left
out by default.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from mr2probe.atomic import atomic_text
from mr2probe.csvnames import csv_labels
from mr2probe.inference import VERDICTS
from mr2probe.metrics import null_name
from mr2probe.summary import family_verdicts, is_comparison


def study_frame(root: Path, skip: list[str]) -> pd.DataFrame:
    """The per-run rows of every summary.csv under ``root`` (one folder level; folders in ``skip`` left out),
    ``folder`` and ``cell`` added."""
    frames = []
    for path in sorted(p for p in root.glob("*/summary.csv") if p.parent.name not in skip):
        df = csv_labels(pd.read_csv(path))  # the tables' labels (ΔHard_q, …) from either CSV naming
        df = df[df["scope"] == "run"].copy()
        df.insert(0, "folder", path.parent.name)
        df.insert(1, "cell", path.parent.name + "/" + df["run"].astype(str))
        frames.append(df)
    if not frames:
        raise SystemExit(f"no summary.csv under {root}/*/: run `mr2probe bench … --report-only` first")
    return pd.concat(frames, ignore_index=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--skip", nargs="*", default=["positive-control"],
                    help="folders left out (the positive control is made on features altered on purpose)")
    args = ap.parse_args()
    out = args.out or args.root / "study-verdicts"
    df = family_verdicts(study_frame(args.root, args.skip)).rename(
        columns={"ΔHard_q_all": "ΔHard_q_study", "ΔHard_verdict_all": "ΔHard_verdict_study"})
    comp = df[is_comparison(df)]
    counts = (comp.groupby(["method", "reference"])["ΔHard_verdict_study"].value_counts().unstack(fill_value=0)
              .reindex(columns=list(VERDICTS), fill_value=0))
    counts.insert(0, "cells", counts.sum(axis=1))
    nulls = df[df["method"] == df["reference"].map(null_name)]
    excl = ((nulls["ΔHard_ci_lo"] > 0) | (nulls["ΔHard_ci_hi"] < 0))
    lines = ["# Verdicts of ΔHard over the whole study", "",
             f"{len(comp)} method × cell comparisons with their cell's reference in one Benjamini–Hochberg family "
             "(q < 0.05: better / worse; else TOST at each cell's equivalence margin: equivalent; else "
             f"inconclusive), from the per-run rows of {df['folder'].nunique()} folders' summary.csv. Null controls: "
             f"{int(excl.sum())} of {len(nulls)} have a ΔHard 95% CI that excludes 0.", "",
             counts.reset_index().to_markdown(index=False), ""]
    hits = comp[comp["ΔHard_verdict_study"].isin(["better", "worse"])].sort_values(["method", "ΔHard"])
    if len(hits):
        cols = ["method", "reference", "cell", "ΔHard", "ΔHard_ci_lo", "ΔHard_ci_hi", "ΔHard_q_study",
                "ΔHard_verdict_study"]
        lines += ["## Better or worse than the reference", "",
                  hits[cols].to_markdown(index=False, floatfmt=".3g"), ""]
    atomic_text(out.with_suffix(".md"), "\n".join(lines))
    atomic_text(out.with_suffix(".csv"), df.to_csv(index=False, float_format="%.4f", lineterminator="\n"))
    print("\n".join(lines[:7]))
    print(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.csv')}")


if __name__ == "__main__":
    main()
