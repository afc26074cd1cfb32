"""The committed study's comparisons in pre-declared Benjamini–Hochberg families, one per claim.

    python benchmarks/study_verdicts.py results [--out results/study-verdicts]

Reads the per-run rows of every ``results/<folder>/summary.csv`` (written by ``mr2probe bench … --report-only``:
one row per run and method, with the run's ΔHard, its two-stage p, TOST p_equiv, MDE and equivalence bound), keeps
every comparison with a run's reference (neither the reference nor its null control) once (the same runs copied into
several folders give the same row: de-duplicated on method, reference and the row's numbers), and corrects each
family on its own:

* **primary** families, declared before looking: ``mr2`` against ``ce`` (the paper's claim) and ``mr2`` against
  ``mr2_uniform`` (its dose: the class-dependent margin itself);
* **secondary** families: every other method against its reference, one family per (method, reference);
* **one class order** families: the comparisons of long-tailed cells trained on one class order (one episode, or
  ``order=fixed``), one family per (method, reference), reported and corrected on their own but behind no claim:
  their replicates share which classes are rare, so rarity is confounded with the classes that order made rare.

So strong effects of other methods (hundreds of p < 1e-4) do not loosen the correction of a claim. Writes
``OUT.csv`` (every distinct row with ``family``, ``ΔHard_q_study`` and ``ΔHard_verdict_study``; the verdict rule of
the tables: better / worse at q < 0.05, else underpowered where the cell's MDE exceeds its margin, equivalent by TOST,
identical predictions) and ``OUT.md`` (per family: comparisons and the count of each verdict; the better / worse
cells). The null controls are counted apart: how many of their ΔHard CIs exclude 0. The positive control (features
altered on purpose) and the protocol-sensitivity folder (one cell rerun under other protocols) are left out by default.
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


PRIMARY = {("mr2", "ce"): "primary: mr2 vs ce", ("mr2", "mr2_uniform"): "primary: mr2 vs mr2_uniform"}
KEY = ["method", "reference", "ΔHard", "ΔHard_ci_lo", "ΔHard_ci_hi", "ΔHard_p", "All"]  # equal rows: the same runs


def study_frame(root: Path, skip: list[str]) -> pd.DataFrame:
    """The per-run rows of every summary.csv under ``root`` (one folder level; folders in ``skip`` left out), with
    the tables' labels (:func:`~mr2probe.csvnames.csv_labels`), ``folder`` and ``cell`` added."""
    frames = []
    for path in sorted(p for p in root.glob("*/summary.csv") if p.parent.name not in skip):
        df = csv_labels(pd.read_csv(path))
        df = df[df["scope"] == "run"].copy()
        df.insert(0, "folder", path.parent.name)
        df.insert(1, "cell", path.parent.name + "/" + df["run"].astype(str))
        frames.append(df)
    if not frames:
        raise SystemExit(f"no summary.csv under {root}/*/: run `mr2probe bench … --report-only` first")
    return pd.concat(frames, ignore_index=True)


def distinct(df: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct comparison (:data:`KEY` rounded to 4 decimals); ``cells`` lists every cell it stands
    for, ``copies`` how many."""
    key = df[KEY].round(4).astype(str).agg("|".join, axis=1)
    cells = df.groupby(key, sort=False)["cell"].agg(lambda c: ", ".join(c))
    out = df.loc[~key.duplicated()].copy()
    out["copies"] = key[~key.duplicated()].map(key.value_counts()).to_numpy()
    out["cells"] = key[~key.duplicated()].map(cells).to_numpy()
    return out


ONE_ORDER = "one class order"  # a long tail whose rare classes are the same in every replicate (Profile.describe)


def family_of(method: str, reference: str, setting: str) -> str:
    """:data:`PRIMARY`, else "secondary: METHOD vs REFERENCE"; a long-tailed cell with one class order (its
    ``setting`` says so) goes to "one class order: METHOD vs REFERENCE" whatever the method: there rarity stays with
    the classes that order made rare, so no claim rests on it."""
    if ONE_ORDER in str(setting):
        return f"{ONE_ORDER}: {method} vs {reference}"
    return PRIMARY.get((method, reference), f"secondary: {method} vs {reference}")


def profile_of(setting: str) -> str:
    """The training profile of a cell's title, coarsely: ``longtail, N class orders`` / ``longtail, one class
    order``, ``shots``, ``fraction`` or ``full`` (the title names no profile for the full set)."""
    train = str(setting).partition("train: ")[2]
    if not train:
        return "full"
    kind = train.split()[0]
    if kind == "longtail":
        return "longtail, " + train.rpartition(", ")[2].split(" (seed")[0]
    return kind


def counts_by_profile(comp: pd.DataFrame) -> pd.DataFrame:
    """Per family, training profile (:func:`profile_of`) and head: the number of comparisons and of each verdict."""
    keys = ["family", "profile", "head"]
    counts = (comp.groupby(keys)["ΔHard_verdict_study"].value_counts().unstack(fill_value=0)
              .reindex(columns=list(VERDICTS), fill_value=0))
    counts.insert(0, "comparisons", counts.sum(axis=1))
    return counts.reset_index()


def by_family(comp: pd.DataFrame) -> pd.DataFrame:
    """``family`` (:func:`family_of`) and, within each family, ``ΔHard_q_study`` / ``ΔHard_verdict_study``
    (:func:`~mr2probe.summary.family_verdicts`)."""
    comp = comp.copy()
    comp["family"] = [family_of(m, r, s) for m, r, s in zip(comp["method"], comp["reference"], comp["setting"])]
    comp["profile"] = comp["setting"].map(profile_of)
    parts = [family_verdicts(g).rename(columns={"ΔHard_q_all": "ΔHard_q_study",
                                                "ΔHard_verdict_all": "ΔHard_verdict_study"})
             for _, g in comp.groupby("family", sort=True)]
    return pd.concat(parts).sort_values(["family", "ΔHard"])


SPREAD_BANDS = ((1.05, "off (≈ uniform)"), (1.2, "weak"), (float("inf"), "on"))  # γ_max/γ_min: a reading aid


def mr2_state(spread: float) -> str:
    """MR2 "off" (γ_max/γ_min < 1.05), "weak" (< 1.2) or "on", from the margins' spread (:data:`SPREAD_BANDS`)."""
    return next(label for edge, label in SPREAD_BANDS if spread < edge) if pd.notna(spread) else "—"


def verdict_text(row: pd.Series) -> str:
    """``equivalent within ±0.04 (0.75)``, ``underpowered (MDE 1.22) (0.66)``, ``worse (0.03)``: the study
    verdict with its bound or MDE and q_s."""
    v = row["ΔHard_verdict_study"]
    extra = {"equivalent": f" within ±{row['ΔHard_equiv_bound']:.2f}",
             "underpowered": f" (MDE {row['ΔHard_resolution']:.2f})"}.get(v, "")
    return f"{v}{extra} ({row['ΔHard_q_study']:.2f})"


def mr2_cells_markdown(comp: pd.DataFrame) -> list[str]:
    """Every comparison of the primary families, sorted by the margins' spread: cell(s), ΔHard [CI], verdict,
    γ_max/γ_min, premise r and MR2 off / weak / on."""
    lines = []
    for family, rows in comp[comp["family"].str.startswith("primary")].groupby("family", sort=True):
        rows = rows.sort_values(["margin_spread", "cells"])
        table = pd.DataFrame({
            "cell": rows["cells"].str.replace(", ", "<br>"),
            "ΔHard [95% CI]": [f"{d:+.2f} [{lo:+.2f}, {hi:+.2f}]" for d, lo, hi in
                               zip(rows["ΔHard"], rows["ΔHard_ci_lo"], rows["ΔHard_ci_hi"])],
            "verdict (q_s)": rows.apply(verdict_text, axis=1),
            "γ_max/γ_min": rows["margin_spread"].map(lambda v: f"{v:.3f}"),
            "premise r": rows["premise_r"].map(lambda v: f"{v:+.2f}"),
            "MR2": rows["margin_spread"].map(mr2_state)})
        lines += [f"**`{family.split(': ')[1].replace(' vs ', '` vs `')}`** ({len(rows)})", "",
                  table.to_markdown(index=False, colalign=("left", "left", "left", "right", "right", "left")), ""]
    return lines


ABBREV = {"fashion-mnist": "F", "mnist": "M", "efficientnet-lite0": "E", "dinov2-s14": "D"}  # column labels
SHORT_VERDICT = {"better": "**better**", "worse": "**worse**", "equivalent": "equiv.", "underpowered": "underp.",
                 "inconclusive": "inconcl.", "identical": "identical"}


def five_order_table(comp: pd.DataFrame, reference: str = "ce", head: str | None = None) -> pd.DataFrame:
    """The long-tailed cells with several class orders (of one ``head``, or every head) as one method × cell table:
    ΔHard against ``reference`` and its study verdict (q_s), e.g. ``+21.64 **better**``; columns ``F×D lin ρ=100``
    (dataset × encoder initials, head, imbalance ratio), methods in the order of their mean ΔHard."""
    rows = comp[comp["profile"].str.startswith("longtail, ") & ~comp["profile"].str.contains(ONE_ORDER)
                & (comp["reference"] == reference) & (head is None or comp["head"] == head)].copy()
    if rows.empty:
        return pd.DataFrame()
    rho = rows["setting"].str.extract(r"ρ=(\d+)", expand=False).astype(int)
    rows["cell"] = [f"{ABBREV.get(d, d)}×{ABBREV.get(e, e)} {h[:3]} ρ={r}"
                    for d, e, h, r in zip(rows["dataset"], rows["encoder"], rows["head"], rho)]
    rows["order"] = list(zip(rows["head"] != "linear", rows["dataset"], rows["encoder"], -rho))
    cells = rows.drop_duplicates("cell").sort_values("order")["cell"].tolist()
    rows["text"] = [f"{d:+.2f} {SHORT_VERDICT.get(v, v)}" for d, v in zip(rows["ΔHard"], rows["ΔHard_verdict_study"])]
    table = rows.pivot_table(index="method", columns="cell", values="text", aggfunc="first").reindex(columns=cells)
    order = rows.groupby("method")["ΔHard"].mean().sort_values(ascending=False).index
    return table.loc[order].fillna("—")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--skip", nargs="*", default=["positive-control", "mnist-dinov2s14-500-sensitivity"],
                    help="folders left out (the positive control is made on features altered on purpose; the "
                         "sensitivity folder reruns one cell under other protocols: benchmarks/sensitivity.py)")
    args = ap.parse_args()
    out = args.out or args.root / "study-verdicts"
    df = study_frame(args.root, args.skip)
    comp = by_family(distinct(df[is_comparison(df)]))
    counts = (comp.groupby("family")["ΔHard_verdict_study"].value_counts().unstack(fill_value=0)
              .reindex(columns=list(VERDICTS), fill_value=0))
    counts.insert(0, "comparisons", counts.sum(axis=1))
    counts = counts.loc[sorted(counts.index, key=lambda f: (not f.startswith("primary"), f))]
    nulls = distinct(df[df["method"] == df["reference"].map(null_name)])
    excl = ((nulls["ΔHard_ci_lo"] > 0) | (nulls["ΔHard_ci_hi"] < 0))
    lines = ["# Verdicts of ΔHard over the whole study, by family", "",
             f"{int(is_comparison(df).sum())} method × cell rows with their cell's reference, {len(comp)} distinct "
             f"(the same runs in several folders counted once), from the per-run rows of {df['folder'].nunique()} "
             "folders' summary.csv; Benjamini–Hochberg within each family (primary: the claims about MR2, "
             "declared in advance; secondary: one per other method and reference; one class order: the long-tailed "
             "cells whose rare classes are the same in every replicate, behind no claim). Verdicts: q < 0.05 better / "
             "worse; else underpowered where the cell's MDE (the larger of the method's and the null control's) "
             "exceeds its equivalence margin or there is one replicate; else TOST: equivalent; else inconclusive; "
             f"identical: the reference's predictions. Null controls: {int(excl.sum())} of {len(nulls)} distinct have "
             "a ΔHard 95% CI that excludes 0.", "",
             counts.reset_index().to_markdown(index=False), ""]
    cols = ["family", "cells", "ΔHard", "ΔHard_ci_lo", "ΔHard_ci_hi", "ΔHard_equiv_bound", "ΔHard_mde",
            "ΔHard_q_study", "ΔHard_verdict_study"]
    cols = [c for c in cols if c in comp]
    primary = comp[comp["family"].str.startswith("primary")]
    lines += ["## The primary families, every comparison", "", primary[cols].to_markdown(index=False, floatfmt=".3g"),
              ""]
    lines += ["## MR2 cell by cell", "", "Sorted by the margins' spread γ_max/γ_min; MR2 off below 1.05, weak below "
              "1.2, on from 1.2 (a reading aid). Cells joined by `<br>` are the same runs in several folders.", ""]
    lines += mr2_cells_markdown(comp)
    lines += ["## Verdicts by training profile and head", "",
              counts_by_profile(comp).to_markdown(index=False), ""]
    five = {head: five_order_table(comp, head=head) for head in ("linear", "cosine")}
    if any(len(t) for t in five.values()):
        lines += ["## Long-tailed cells with several class orders: ΔHard against CE", "",
                  "Each cell's ΔHard and its verdict in its family (q_s); columns: dataset × encoder (F Fashion-MNIST, "
                  "M MNIST; E EfficientNet-Lite0, D DINOv2-S), head, imbalance ratio ρ; — where the cell did not "
                  "train the method; one table per head.", ""]
        lines += [line for t in five.values() if len(t) for line in (t.reset_index().to_markdown(index=False), "")]
    hits = comp[comp["ΔHard_verdict_study"].isin(["better", "worse"]) & ~comp["family"].str.startswith("primary")]
    if len(hits):
        lines += ["## Secondary families: better or worse than the reference", "",
                  hits[cols].to_markdown(index=False, floatfmt=".3g"), ""]
    atomic_text(out.with_suffix(".md"), "\n".join(lines))
    atomic_text(out.with_suffix(".csv"), comp.to_csv(index=False, float_format="%.4f", lineterminator="\n"))
    print("\n".join(lines[:7]))
    print(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.csv')}")


if __name__ == "__main__":
    main()
