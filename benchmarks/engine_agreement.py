"""Do two trainings of the same runs agree? Every method's All and Hard (test accuracy overall and on the hard
classes, mean over replicates) in each run folder of NEW against the folder of the same name in OLD, with the null
control's SD (the spread of the reference retrained on other seeds: what training noise alone moves) as the yardstick.

Usage: python benchmarks/engine_agreement.py OLD_ROOT NEW_ROOT  (roots of run folders holding results.json; e.g. the
committed results/positive-control against the same suite trained again into another folder). Prints one row per
run × method and the count of methods whose |ΔAll| or |ΔHard| reaches the null control's SD of that column (a Δ of
exactly 0 counts as within it), and per run how many test predictions differ (where the two runs have the same shape).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from mr2probe.metrics import null_name
from mr2probe.report import load_predictions, load_results
from mr2probe.summary import summarize


def frame(run: Path) -> tuple[pd.DataFrame, str | None]:
    results = load_results(run)
    summary = summarize(results, load_predictions(run))
    null = null_name(summary.reference) if hasattr(summary, "reference") else None
    return summary.frame(), null if null in summary.frame().index else None


def same_predictions(old: Path, new: Path) -> tuple[int, int] | None:
    """(entries that differ, entries) of the two runs' test predictions, None where their shapes differ."""
    a, b = np.load(old / "predictions.npz")["predictions"], np.load(new / "predictions.npz")["predictions"]
    return (int((a != b).sum()), a.size) if a.shape == b.shape else None


def compare(old_root: Path, new_root: Path) -> pd.DataFrame:
    rows = []
    for new in sorted(p.parent for p in new_root.glob("*/results.json")):
        old = old_root / new.name
        if not (old / "results.json").exists():
            continue
        f_old, null = frame(old)
        f_new, _ = frame(new)
        same = same_predictions(old, new)
        print(f"{new.name}: " + (f"{same[0]} of {same[1]} test predictions differ" if same else
                                 "predictions of other shapes (other seeds or methods)"))
        for method in f_old.index.intersection(f_new.index):
            row = {"run": new.name, "method": method}
            for col in ("All", "Hard"):
                row[f"d{col}"] = f_new.loc[method, col] - f_old.loc[method, col]
                row[f"null_sd_{col}"] = f_old.loc[null, f"{col}_sd"] if null else float("nan")
            rows.append(row)
    df = pd.DataFrame(rows)
    moved = {c: (df[f"d{c}"].abs() < df[f"null_sd_{c}"]) | (df[f"d{c}"] == 0) for c in ("All", "Hard")}
    df["within"] = moved["All"] & moved["Hard"]  # less than the null control's SD, or not at all
    return df


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    args = ap.parse_args()
    df = compare(args.old, args.new)
    with pd.option_context("display.width", 160, "display.max_rows", 500):
        print(df.round(3).to_string(index=False))
    moved = df[~df["within"]]
    named = f" ({', '.join(moved['run'] + '/' + moved['method'])})" if len(moved) else ""
    print(f"methods × runs compared: {len(df)}; |ΔAll| and |ΔHard| below the null control's SD: "
          f"{int(df['within'].sum())}; at or above it: {len(moved)}{named}")
    print(f"largest |ΔAll| {df['dAll'].abs().max():.3f}, largest |ΔHard| {df['dHard'].abs().max():.3f} points")


if __name__ == "__main__":
    main()
