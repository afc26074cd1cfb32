"""benchmarks/sensitivity.py (claims × cells, verdict flips) and benchmarks/readme_table.py on hand-made rows."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pandas as pd

from conftest import ROOT

_spec = importlib.util.spec_from_file_location("sensitivity", ROOT / "benchmarks" / "sensitivity.py")
sensitivity = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sensitivity)


def _row(run: str, method: str, d: float, verdict: str, q: float, spread: float | None = None,
         d_all: float = 0.0) -> dict:
    return {"scope": "run", "run": run, "method": method, "delta_hard": d, "delta_hard_ci_lo": d - 1,
            "delta_hard_ci_hi": d + 1, "delta_hard_q": q, "delta_hard_equiv_bound": abs(d) + 1,
            "delta_hard_verdict": verdict, "delta_all": d_all, "margin_spread": spread}


def _summary() -> pd.DataFrame:
    rows = []
    for run, (mr2_v, la_v), check in [("floor-grid2x2", ("equivalent", "better"), 0.9),
                                       ("floor-grid3x3", ("equivalent", "underpowered"), 0.2),
                                       ("reach-grid2x2", ("underpowered", "better"), 0.1)]:
        rows += [_row(run, "mr2", 0.1, mr2_v, 0.5, spread=1.02), _row(run, "logit_adjust", 9.0, la_v, 0.01),
                 _row(run, "logreg", 0.0, "underpowered", 0.9, d_all=check), _row(run, "ce", 0.0, "identical", 1.0)]
    rows.append({**_row("", "mr2", 0.0, "", 1.0), "scope": "folder"})  # folder-wide rows are not cells
    return pd.DataFrame(rows)


def test_flips_are_the_verdicts_that_differ_from_the_base_cell():
    rows = sensitivity.claim_rows(_summary(), ("mr2", "logit_adjust"))
    assert len(rows) == 6  # 2 claims × 3 cells; the folder row, the check and the reference are not claims
    assert rows.set_index("run")["check_delta_all"].to_dict() == {"floor-grid2x2": 0.9, "floor-grid3x3": 0.2,
                                                                  "reach-grid2x2": 0.1}
    flipped = sensitivity.flips(rows, "floor-grid2x2")
    assert sorted(zip(flipped["method"], flipped["run"], flipped["base_verdict"], flipped["delta_hard_verdict"])) == [
        ("logit_adjust", "floor-grid3x3", "better", "underpowered"),
        ("mr2", "reach-grid2x2", "equivalent", "underpowered")]


def test_script_writes_the_page_and_prints_the_flips(tmp_path):
    _summary().to_csv(tmp_path / "summary.csv", index=False)
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sensitivity.py"), str(tmp_path),
                          "--claims", "mr2,logit_adjust"], capture_output=True, text=True, check=True).stdout
    assert "2 of 4 verdicts differ from floor-grid2x2" in out
    page = (tmp_path / "sensitivity.md").read_text()
    assert "+9.00 [8.00, 10.00] better (q 0.01)" in page
    assert "| mr2_uniform" not in page
    assert len(pd.read_csv(tmp_path / "sensitivity.csv")) == 6
    assert "| floor-grid2x2 |             0.900 |               1.020 |" in page  # the mr2 row's spread alone


_rt_spec = importlib.util.spec_from_file_location("readme_table", ROOT / "benchmarks" / "readme_table.py")
readme_table = importlib.util.module_from_spec(_rt_spec)
_rt_spec.loader.exec_module(readme_table)


def test_readme_table_cells_and_rows():
    """benchmarks/readme_table.py: one cell per method × run, the null control's MDE first."""
    base = {"scope": "run", "reference": "ce", "delta_hard_equiv_bound": 0.71, "delta_hard_mde": 0.98}
    rows = [{**base, "run": "a", "method": "ce (null)", "delta_hard": -0.18, "delta_hard_ci_lo": -0.96,
             "delta_hard_ci_hi": 0.60, "delta_hard_verdict_all": "equivalent"},
            {**base, "run": "a", "method": "la", "delta_hard": 14.19, "delta_hard_ci_lo": 8.12,
             "delta_hard_ci_hi": 20.26, "delta_hard_verdict_all": "underpowered"},
            {**base, "run": "a", "method": "u", "delta_hard": 0.0, "delta_hard_ci_lo": 0.0, "delta_hard_ci_hi": 0.0,
             "delta_hard_verdict_all": "identical"}]
    text = readme_table.readme_table(pd.DataFrame(rows), [("ρ=100", "a")], readme_table.pairs(["LA=la", "u"]))
    assert text.splitlines() == ["| method | ρ=100 |", "|:--|:--|", "| **null control's MDE** | 0.98 |",
                                 "| ce (null) | −0.18 [−1.0, 0.6] equiv. ±0.71 |",
                                 "| LA | +14.19 [8.1, 20.3] underp. |", "| u | 0.00 identical |"]


def test_the_readme_table_is_what_its_command_prints():
    """The README's results table is the output of the command written under it, on the committed summary.csv."""
    import re
    import shlex

    readme = (ROOT / "README.md").read_text()
    command = re.search(r"<sub>`(python benchmarks/readme_table\.py [^`]+)`</sub>", readme).group(1)
    args = shlex.split(command)[1:]
    out = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() and out.strip() in readme


def test_readme_table_names_what_summary_csv_lacks(tmp_path):
    """A missing summary.csv, run or method is one line and exit 1, not a traceback."""
    script = str(ROOT / "benchmarks" / "readme_table.py")
    r = subprocess.run([sys.executable, script, str(tmp_path), "--runs", "a", "--methods", "b"],
                       capture_output=True, text=True)
    expected = f"no {tmp_path / 'summary.csv'}: run `mr2probe bench … --report-only` first"
    assert r.returncode == 1 and r.stderr.strip() == expected
    pd.DataFrame([{"scope": "run", "run": "a", "method": "ce (null)", "reference": "ce"}]).to_csv(
        tmp_path / "summary.csv", index=False)
    r = subprocess.run([sys.executable, script, str(tmp_path), "--runs", "a", "--methods", "b"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.strip() == "not in summary.csv (run/method): a/b"


_sv_spec = importlib.util.spec_from_file_location("study_verdicts", ROOT / "benchmarks" / "study_verdicts.py")
study_verdicts = importlib.util.module_from_spec(_sv_spec)
_sv_spec.loader.exec_module(study_verdicts)


def test_one_class_order_cells_sit_in_their_own_families():
    five = "dinov2-s14 on mnist, linear head, adapter none, train: longtail ρ=100 × 5 episodes, 5 class orders (seed 0)"
    one = "dinov2-s14 on mnist, linear head, adapter none, train: longtail ρ=100, one class order (seed 0)"
    assert study_verdicts.family_of("mr2", "ce", five) == "primary: mr2 vs ce"
    assert study_verdicts.family_of("mr2", "ce", one) == "one class order: mr2 vs ce"
    assert study_verdicts.family_of("ldam", "ce", one) == "one class order: ldam vs ce"
    assert study_verdicts.family_of("ldam", "ce", "mnist, linear head") == "secondary: ldam vs ce"


def test_the_committed_primary_families_hold_no_one_order_cell():
    df = pd.read_csv(ROOT / "results" / "study-verdicts.csv")
    primary = df[df["family"].str.startswith("primary")]
    assert len(primary) > 0 and not primary["setting"].str.contains("one class order").any()
    lt = df[df["setting"].str.contains("longtail", na=False)]
    assert lt["setting"].str.contains("class order").all(), "every long-tailed row says how many class orders it has"


def test_profiles_of_cell_titles():
    t = "dinov2-s14 on mnist, linear head, adapter none"
    assert study_verdicts.profile_of(t) == "full"
    assert study_verdicts.profile_of(t + ", train: shots 5 × 5 episodes (seed 0)") == "shots"
    one = t + ", train: longtail ρ=10, one class order (seed 0)"
    assert study_verdicts.profile_of(one) == "longtail, one class order"
    five = t + ", train: longtail ρ=100 × 5 episodes, 5 class orders (seed 0)"
    assert study_verdicts.profile_of(five) == "longtail, 5 class orders"
    comp = pd.DataFrame({"family": ["f", "f", "f"], "profile": ["shots", "shots", "full"], "head": ["linear"] * 3,
                         "ΔHard_verdict_study": ["better", "equivalent", "better"]})
    counts = study_verdicts.counts_by_profile(comp).set_index("profile")
    assert counts.loc["shots", "comparisons"] == 2 and counts.loc["shots", "better"] == 1
    assert counts.loc["full", "better"] == 1 and counts.loc["full", "worse"] == 0


def test_five_order_table_pivots_the_several_order_long_tails_against_ce():
    t = "{} on {}, {} head, adapter none, train: longtail ρ={} × 5 episodes, 5 class orders (seed 0)"
    one = "dinov2-s14 on mnist, linear head, adapter none, train: longtail ρ=100, one class order (seed 0)"
    comp = pd.DataFrame({
        "method": ["ldam", "mr2", "ldam", "ldam", "mr2"],
        "reference": ["ce", "ce", "ce", "ce", "mr2_uniform"],
        "dataset": ["mnist", "mnist", "mnist", "mnist", "mnist"],
        "encoder": ["dinov2-s14"] * 5,
        "head": ["linear", "linear", "cosine", "linear", "linear"],
        "setting": [t.format("dinov2-s14", "mnist", "linear", 100), t.format("dinov2-s14", "mnist", "linear", 100),
                    t.format("dinov2-s14", "mnist", "cosine", 10), one, t.format("dinov2-s14", "mnist", "linear", 100)],
        "ΔHard": [18.234, -0.11, -12.95, 30.0, 0.5],
        "ΔHard_verdict_study": ["better", "equivalent", "worse", "better", "equivalent"]})
    comp["profile"] = comp["setting"].map(study_verdicts.profile_of)
    table = study_verdicts.five_order_table(comp)
    assert list(table.columns) == ["M×D lin ρ=100", "M×D cos ρ=10"], "linear before cosine; one order left out"
    assert list(table.index) == ["ldam", "mr2"], "by mean ΔHard, the mr2_uniform reference left out"
    assert table.loc["ldam", "M×D lin ρ=100"] == "+18.23 **better**"
    assert table.loc["ldam", "M×D cos ρ=10"] == "-12.95 **worse**"
    assert table.loc["mr2", "M×D cos ρ=10"] == "—" and table.loc["mr2", "M×D lin ρ=100"] == "-0.11 equiv."
    assert list(study_verdicts.five_order_table(comp, head="cosine").index) == ["ldam"]
