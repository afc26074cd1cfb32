"""The README's results table from a folder's summary.csv: ΔHard [95% CI] and the folder-wide verdict per method × run.

    python benchmarks/readme_table.py results/fmnist-effl0-settings \
        --runs "longtail ρ=100 (5 orders)=linear-longtail100-orders5" "20 shots=linear-shots20" \
        --methods "logit_adjust = balanced_softmax=logit_adjust" "mr2" ...

Each cell is ``+14.19 [8.1, 20.3] better``: ΔHard (points, method − reference on the same replicates), its 95% CI,
and ``verdict (all)`` (BH over every method × run of the folder; ``equiv. ±b`` with the TOST's equivalence bound,
``underp.`` / ``inconcl.`` abbreviated; ``0.00 identical`` where every replicate predicts as the reference). The first
row is the null control's MDE per run. Prints the markdown table (nothing is written).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

SHORT = {"underpowered": "underp.", "inconclusive": "inconcl."}


def signed(v: float, digits: int) -> str:
    """``+1.23`` / ``−1.23`` (a true minus sign) / ``0.00``."""
    text = f"{abs(v):.{digits}f}"
    return text if text.strip("0.") == "" else ("+" if v > 0 else "−") + text


def cell(row: pd.Series) -> str:
    """One method × run: ``+14.19 [8.1, 20.3] better``, ``−0.18 [−1.0, 0.6] equiv. ±0.71``, ``0.00 identical``."""
    verdict = row["delta_hard_verdict_all"]
    if verdict == "identical":
        return "0.00 identical"
    ci = f"[{signed(row['delta_hard_ci_lo'], 1)}, {signed(row['delta_hard_ci_hi'], 1)}]".replace("+", "")
    tail = f"equiv. ±{row['delta_hard_equiv_bound']:.2f}" if verdict == "equivalent" else SHORT.get(verdict, verdict)
    return f"{signed(row['delta_hard'], 2)} {ci} {tail}"


def pairs(items: list[str]) -> list[tuple[str, str]]:
    """``LABEL=NAME`` (or ``NAME``, labelled by itself) → (label, name); the last ``=`` splits."""
    return [tuple(i.rsplit("=", 1)) if "=" in i else (i, i) for i in items]


def readme_table(summary: pd.DataFrame, runs: list[tuple[str, str]], methods: list[tuple[str, str]]) -> str:
    """The markdown table: the null control's MDE per run, then one row per method."""
    rows = summary[summary["scope"] == "run"].set_index(["run", "method"])
    reference = summary.loc[summary["scope"] == "run", "reference"].iloc[0]
    null = f"{reference} (null)"
    missing = [f"{r}/{m}" for _, r in runs for _, m in [(null, null)] + methods if (r, m) not in rows.index]
    if missing:
        raise SystemExit(f"not in summary.csv (run/method): {', '.join(missing)}")
    header = "| method | " + " | ".join(label for label, _ in runs) + " |"
    lines = [header, "|:--|" + ":--|" * len(runs),
             "| **null control's MDE** | " + " | ".join(f"{rows.loc[(r, null), 'delta_hard_mde']:.2f}"
                                                       for _, r in runs) + " |"]
    for label, method in [(null, null)] + methods:
        lines.append(f"| {label} | " + " | ".join(cell(rows.loc[(r, method)]) for _, r in runs) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--runs", nargs="+", required=True, help="LABEL=RUN columns, in order")
    ap.add_argument("--methods", nargs="+", required=True, help="LABEL=METHOD rows, in order")
    args = ap.parse_args()
    path = args.folder / "summary.csv"
    if not path.exists():
        raise SystemExit(f"no {path}: run `mr2probe bench … --report-only` first")
    print(readme_table(pd.read_csv(path), pairs(args.runs), pairs(args.methods)))


if __name__ == "__main__":
    main()
