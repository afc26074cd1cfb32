"""How often the null control's ΔHard 95% CI excludes 0 over the committed tables (a calibrated rule: about 5%).

    python benchmarks/null_calibration.py results [--out results/null-calibration]

Every run folder under the given roots whose results.json has a null control is summarised (nothing is written
into it) under three rules, and the tables whose null ΔHard CI excludes 0 are counted:

* ``two-stage``: the tables' rule (mr2probe.inference; groups ranked leave one replicate out on val);
* ``images, pooled``: test images alone (the image stage's SE, normal quantiles) with groups ranked on the pooled
  val accuracy of the reference, the rule the tables used before the two-stage one;
* ``two-stage, pooled``: the two-stage SE with pooled groups (what the ranking alone changes).

Run folders with identical results (the same runs copied into two folders) count once.
"""
from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
from rich.progress import track

from mr2probe.atomic import atomic_text
from mr2probe.report import load_predictions, load_results
from mr2probe.summary import summarize

Z = 1.959963984540054  # the normal 0.975 quantile


def rows_of(run_dir: Path) -> list[dict]:
    """The null control's ΔHard under the three rules (one row each), or [] without a null control."""
    results = load_results(run_dir)
    preds = load_predictions(run_dir)
    if not results.null_control:
        return []
    out = []
    for rule, group_on in (("two-stage", "val"), ("two-stage, pooled", "val-pooled")):
        s = summarize(results, preds, group_on)
        e = s.inference[s.null]["ΔHard"]
        df = np.inf if e["df"] is None else e["df"]
        out.append({"rule": rule, "estimate": e["estimate"], "lo": e["ci"][0], "hi": e["ci"][1], "df": df,
                    "replicates": e["replicates"], "clusters": e["clusters"]})
        if group_on == "val-pooled" and e["se_image"] is not None:
            half = Z * e["se_image"]
            out.append({"rule": "images, pooled", "estimate": e["estimate"], "lo": e["estimate"] - half,
                        "hi": e["estimate"] + half, "df": np.inf, "replicates": e["replicates"],
                        "clusters": e["clusters"]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("roots", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=None, help="also write OUT.md (the table) and OUT.csv (every row)")
    args = ap.parse_args()
    dirs = sorted({p.parent for root in args.roots for p in root.rglob("results.json")})
    seen: set[str] = set()
    rows = []
    for d in track(dirs, description="summarising"):
        key = hashlib.sha256(json.dumps(json.loads((d / "results.json").read_text())["runs"],
                                        sort_keys=True).encode()).hexdigest()
        if key in seen:
            continue
        seen.add(key)
        rows += [{"run": str(d), **r} for r in rows_of(d)]
    df = pd.DataFrame(rows)
    df["excludes_0"] = (df["lo"] > 0) | (df["hi"] < 0)
    table = df.groupby("rule", sort=False)["excludes_0"].agg(["sum", "count", "mean"])
    table.columns = ["tables whose null CI excludes 0", "null-controlled tables", "share"]
    lines = [table.to_markdown(floatfmt=("", ".0f", ".0f", ".3f")), ""]
    for _, r in df[(df["rule"] == "two-stage") & df["excludes_0"]].iterrows():
        nu = "∞" if not np.isfinite(r["df"]) else format(r["df"], ".1f")
        lines.append(f"- two-stage, excludes 0: `{r['run']}`: {r['estimate']:+.2f} [{r['lo']:+.2f}, {r['hi']:+.2f}], "
                     f"ν = {nu}")
    print("\n".join(lines))
    if args.out:
        atomic_text(args.out.with_suffix(".md"), "# The null control's ΔHard CI over the committed tables\n\n"
                    f"`python benchmarks/null_calibration.py {' '.join(map(str, args.roots))}`; "
                    f"{__doc__.split(chr(10) + chr(10), 2)[2].strip()}\n\n" + "\n".join(lines) + "\n")
        atomic_text(args.out.with_suffix(".csv"), df.to_csv(index=False, float_format="%.4f", lineterminator="\n"))
        print(f"wrote {args.out.with_suffix('.md')} and {args.out.with_suffix('.csv')}")


if __name__ == "__main__":
    main()
