"""How a folder's claims move with the protocol: each claim's ΔHard per cell, and every verdict that flips.

    python benchmarks/sensitivity.py results/mnist-dinov2s14-500-sensitivity [--base floor-grid2x2]

Reads the folder's ``summary.csv`` (written by ``mr2probe bench … --report-only``; one row per run and method) and,
for every claim (a method against the run's reference; :data:`CLAIMS` by default), lays out ΔHard [95% CI], the
verdict and q_t (the table's own family: every cell of the sensitivity suite trains the same methods, so the
families are the same size) per cell, with the cell's reference check (``logreg`` − reference on All: how far the
reference is from what a linear probe reaches) and MR2's margin spread γ_max/γ_min. A verdict *flips* where it
differs from the base cell's (``--base``, the floor rule with the default grid). Writes ``FOLDER/sensitivity.md``
and ``FOLDER/sensitivity.csv`` and prints the flips.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from mr2probe.atomic import atomic_text

CLAIMS = ("mr2", "mr2_uniform", "logit_adjust")  # each against the run's reference (CE)
CHECK = "logreg"  # the exact probe: its ΔAll is the reference check


def claim_rows(summary: pd.DataFrame, claims: tuple[str, ...]) -> pd.DataFrame:
    """One row per (claim, cell): ΔHard, its CI, q_t, verdict, equivalence bound, margin spread, and the cell's
    reference check Δ_check = All(logreg) − All(reference)."""
    runs = summary[summary["scope"] == "run"]
    check = runs[runs["method"] == CHECK].set_index("run")["delta_all"].rename("check_delta_all")
    rows = runs[runs["method"].isin(claims)].join(check, on="run")
    cols = ["method", "run", "delta_hard", "delta_hard_ci_lo", "delta_hard_ci_hi", "delta_hard_q",
            "delta_hard_equiv_bound", "delta_hard_verdict", "delta_all", "margin_spread", "check_delta_all"]
    return rows[cols].reset_index(drop=True)


def cell_text(row: pd.Series) -> str:
    """``+1.23 [0.10, 2.36] better (q 0.012)`` (q below 0.001 as ``<0.001``)."""
    q = "<0.001" if row.delta_hard_q < 0.001 else f"{row.delta_hard_q:.3g}"
    return (f"{row.delta_hard:+.2f} [{row.delta_hard_ci_lo:.2f}, {row.delta_hard_ci_hi:.2f}] "
            f"{row.delta_hard_verdict} (q {q})")


def flips(rows: pd.DataFrame, base: str) -> pd.DataFrame:
    """The (claim, cell) rows whose verdict differs from the same claim's verdict in cell ``base``."""
    base_verdict = rows[rows["run"] == base].set_index("method")["delta_hard_verdict"]
    if base_verdict.empty:
        raise SystemExit(f"no cell named {base!r} in the folder's summary.csv (pass --base)")
    out = rows.assign(base_verdict=rows["method"].map(base_verdict))
    return out[(out["run"] != base) & (out["delta_hard_verdict"] != out["base_verdict"])]


def report(rows: pd.DataFrame, flipped: pd.DataFrame, base: str, folder: Path) -> str:
    """The markdown page: the claims × cells table, the cells' checks, and the flips."""
    order = list(dict.fromkeys(rows["run"]))
    table = (rows.assign(text=rows.apply(cell_text, axis=1)).pivot(index="method", columns="run", values="text")
             .reindex(columns=order))
    checks = pd.DataFrame({"reference_check": rows.groupby("run", sort=False)["check_delta_all"].first(),
                           "mr2_margin_spread": rows[rows["method"] == "mr2"].set_index("run")["margin_spread"]}
                          ).reindex(order)
    lines = [f"# Protocol sensitivity: {folder.name}", "",
             "ΔHard [95% CI] verdict (q_t) of each claim against the reference, per cell (budget rule × lr × wd "
             f"grid; `summary.csv`). Base cell: `{base}`. reference_check = All(logreg) − All(reference): above "
             "0.5 point the reference is under-fit against an exact linear probe.", "",
             table.reset_index().to_markdown(index=False), "", "## Reference check and MR2's margin spread", "",
             checks.reset_index().to_markdown(index=False, floatfmt=".3f"), "",
             f"## Verdicts that differ from `{base}`", ""]
    if flipped.empty:
        lines.append("None: every claim's verdict is the same in every cell.")
    else:
        show = flipped[["method", "run", "base_verdict", "delta_hard_verdict", "delta_hard", "delta_hard_q"]]
        lines.append(show.to_markdown(index=False, floatfmt=".3g"))
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--base", default="floor-grid2x2", help="the cell the others are compared with")
    ap.add_argument("--claims", default=",".join(CLAIMS), help="methods compared with the reference")
    args = ap.parse_args()
    path = args.folder / "summary.csv"
    if not path.exists():
        raise SystemExit(f"no {path}: run `mr2probe bench … --report-only` first")
    rows = claim_rows(pd.read_csv(path), tuple(args.claims.split(",")))
    flipped = flips(rows, args.base)
    atomic_text(args.folder / "sensitivity.md", report(rows, flipped, args.base, args.folder))
    atomic_text(args.folder / "sensitivity.csv", rows.to_csv(index=False, float_format="%.4f", lineterminator="\n"))
    print(f"{len(flipped)} of {len(rows[rows['run'] != args.base])} verdicts differ from {args.base}")
    for r in flipped.itertuples():
        print(f"  {r.method} in {r.run}: {r.base_verdict} -> {r.delta_hard_verdict} "
              f"({r.delta_hard:+.2f}, q {r.delta_hard_q:.3g})")
    print(f"wrote {args.folder / 'sensitivity.md'} and {args.folder / 'sensitivity.csv'}")


if __name__ == "__main__":
    main()
