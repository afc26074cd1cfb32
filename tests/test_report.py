"""The report stage on a results.json written by hand (K = 7, 3 methods × 2 seeds): values, best marks, LaTeX,
CSV, plots, HTML, the Δ summary across runs, and bad run folders → exit 2 with one line."""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from conftest import run_cli
from mr2probe.cli import app
from mr2probe.csvnames import csv_name
from mr2probe.metrics import COLUMNS, DELTA_COLUMNS
from mr2probe.plots import DPI
from conftest import md_rows
from mr2probe.report import load_results, summarize, to_latex, to_markdown

NAMES = [f"class {i}" for i in range(7)]
# ce's mean accuracy [.9 .25 .5 .8 .4 1 .6] → hard = {1, 4}, easy = {0, 5}, medium = {2, 3, 6} (⌊7/3⌋ = 2 each)
ACC = {
    "ce": [[0.90, 0.20, 0.50, 0.80, 0.40, 1.00, 0.60], [0.90, 0.30, 0.50, 0.80, 0.40, 1.00, 0.60]],
    "mr2": [[0.85, 0.40, 0.50, 0.80, 0.50, 0.95, 0.60], [0.85, 0.50, 0.50, 0.80, 0.50, 0.95, 0.60]],
    "mr2_uniform": [[0.95, 0.30, 0.40, 0.70, 0.40, 1.00, 0.50], [0.95, 0.30, 0.40, 0.70, 0.40, 1.00, 0.50]],
}
VARIABILITY = [1.0, 5.0, 2.0, 1.5, 4.0, 0.5, 2.0]  # hard classes 1 and 4 vary most


def write_results(run_dir: Path, acc: dict[str, list[list[float]]] = ACC, head: str = "linear") -> Path:
    """A results.json with the fields the report reads, per_class_acc given by hand."""
    runs = []
    for method, per_seed in acc.items():
        for seed, a in enumerate(per_seed):
            run = {"method": method, "seed": seed, "hparams": {"lr": 0.01}, "per_class_acc": a,
                   "val_per_class_acc": a}
            if method.startswith("mr2"):
                v = np.array(VARIABILITY)
                run |= {"variability": v.tolist(), "margins": (7 * v ** (1 / 3) / (v ** (1 / 3)).sum()).tolist()}
            runs.append(run)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "results.json").write_text(json.dumps({
        "class_names": NAMES, "test_class_counts": [10] * 7, "reference": "ce", "head": head, "adapter": "none",
        "provenance": {"encoder": "hand_enc", "dataset": "hand_ds"}, "runs": runs}))
    return run_dir


def md_cells(md: str) -> dict[str, dict[str, str]]:
    """markdown table → {method: {column: cell}}."""
    lines = [line for line in md.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return {cells[0]: dict(zip(header[1:], cells[1:]))
            for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines[1:])}


def test_values_and_best_marks(tmp_path: Path) -> None:
    s = summarize(load_results(write_results(tmp_path / "run")))
    assert s.groups.hard.tolist() == [1, 4] and s.groups.easy.tolist() == [0, 5]
    assert s.mean["mr2"]["Hard"] == pytest.approx(47.5)  # seeds: (.4+.5)/2 = 45, (.5+.5)/2 = 50
    assert s.std["mr2"]["Hard"] == pytest.approx(np.std([45.0, 50.0], ddof=1))  # sample SD: 3.54, not 2.5
    assert s.mean["ce"]["Hard"] == pytest.approx(32.5)
    assert s.mean["mr2"]["ΔHard"] == pytest.approx(15.0) and s.std["mr2"]["ΔHard"] == pytest.approx(0.0)
    assert s.mean["mr2_uniform"]["Easy"] == pytest.approx(97.5)
    assert s.mean["mr2"]["Gap"] == pytest.approx(90.0 - 47.5)
    cells = md_cells(to_markdown(s))
    bold = {(m, c) for m, row in cells.items() for c, v in row.items() if v.startswith("**")}
    std = {m: np.mean([np.std(a) for a in ACC[m]]) for m in ACC}
    assert ("mr2", "Hard") in bold and ("ce", "Hard") not in bold and ("mr2_uniform", "Hard") not in bold
    assert ("mr2_uniform", "Easy") in bold and ("mr2", "Easy") not in bold
    assert ("mr2", "Gap") in bold and ("mr2", "Worst") in bold and ("mr2", "ΔHard") in bold
    assert ("mr2_uniform", "ΔEasy") in bold and ("mr2", "ΔEasy") not in bold
    assert (min(std, key=std.get), "Std") in bold and sum(c == "Std" for _, c in bold) == 1
    assert cells["ce"]["ΔHard"] == "—" and cells["mr2"]["Hard"] == "**47.50 ± 3.54**"


def test_latex_structure(tmp_path: Path) -> None:
    s = summarize(load_results(write_results(tmp_path / "run")))
    tex = to_latex(s)
    unescaped = re.sub(r"\\[{}]", "", tex)
    assert unescaped.count("{") == unescaped.count("}")
    assert tex.count(r"\begin{tabular}") == 1 and tex.count(r"\end{tabular}") == 1
    lines = tex.splitlines()
    top, mid, bottom = (lines.index(r) for r in (r"\toprule", r"\midrule", r"\bottomrule"))
    assert top < mid < bottom
    rows = lines[mid + 1:bottom]
    assert [r.split(" & ")[0] for r in rows] == ["ce", "mr2", r"mr2\_uniform"]
    assert all(len(r.split(" & ")) == 3 + len(COLUMNS + DELTA_COLUMNS) and r.endswith(r"\\") for r in rows)
    assert r"$\Delta$Hard" in lines[top + 1] and r"$\pm$" in tex and "±" not in tex and "Δ" not in tex
    mr2 = dict(zip(["method"] + COLUMNS + DELTA_COLUMNS, rows[1].removesuffix(r" \\").split(" & ")))
    assert mr2["Hard"] == r"\textbf{47.50 $\pm$ 3.54}" and mr2["ΔEasy"].startswith("$-$")


def test_cli_report_files_plots_html_and_summary(tmp_path: Path) -> None:
    a = write_results(tmp_path / "runs" / "linear")
    b = write_results(tmp_path / "runs" / "cosine", {m: [[min(1.0, x + 0.05 * (m == "mr2")) for x in s] for s in v]
                                                     for m, v in ACC.items()}, head="cosine")
    r = CliRunner().invoke(app, ["report", str(a), str(b), "--html", "--summary", str(tmp_path / "sum")])
    assert r.exit_code == 0, r.output
    for d in (a, b):
        assert {"table.md", "table.csv", "table.tex", "summary.json"} <= {p.name for p in d.iterdir()}
        header = next(csv.reader((d / "table.csv").open()))
        cols = [csv_name(c) for c in COLUMNS + DELTA_COLUMNS]
        assert cols[:2] == ["all", "m_acc"] and "delta_hard" in cols and all(h.isascii() for h in header)
        assert header[:3 + 2 * len(cols)] == ["method"] + cols + [f"{c}_sd" for c in cols] + ["seeds", "groups_on"]
        assert {"delta_hard_ci_lo", "delta_hard_p", "delta_hard_q", "delta_hard_mde", "delta_hard_p_equiv",
                "delta_hard_verdict"} <= set(header)
        for name in ("per_class.png", "groups.png", "variability.png", "tradeoff.png"):
            png = d / name
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
            with Image.open(png) as im:
                assert im.size[0] >= 4 * DPI and im.size[1] >= 2.5 * DPI, (name, im.size)  # inches × DPI
    rows = list(csv.DictReader((tmp_path / "sum.csv").open()))
    per_run = [x for x in rows if x["scope"] == "run"]
    mean = {x["method"]: x for x in rows if x["scope"] == "mean"}
    assert {(x["run"], x["method"]) for x in per_run} == {(r, m) for r in ("linear", "cosine")
                                                          for m in ("ce", "mr2", "mr2_uniform")}
    assert {x["reference"] for x in per_run} == {"ce"} and set(mean) == {"mr2", "mr2_uniform"}
    assert {x["head"] for x in per_run} == {"linear", "cosine"} and all(h.isascii() for h in rows[0])
    run_dh = [float(x["delta_hard"]) for x in per_run if x["method"] == "mr2"]
    assert float(mean["mr2"]["delta_hard"]) == pytest.approx(np.mean(run_dh), abs=1e-4) and mean["mr2"]["runs"] == "2"
    assert run_dh[0] == pytest.approx(15.0) and run_dh[1] == pytest.approx(20.0)  # cosine: mr2 +5 on hard
    md = (tmp_path / "sum.md").read_text()
    runs = {(x["run"], x["method"]): x for x in md_rows(md, "run")}
    assert "mean over 2 runs" in md and runs["cosine", "mr2"]["ΔHard"] == "**+20.00 ± 0.00**"
    assert runs["linear", "mr2"]["dataset"] == "hand_ds" and runs["linear", "ce"]["ΔHard"] == "—"
    assert runs["cosine", "mr2"]["head"] == "cosine"
    assert md_rows(md, "method")[0]["ΔHard"] == "**+17.50 ± 3.54**"  # averages: mean ± SD over the 2 runs
    page = (tmp_path / "report.html").read_text()
    # 4 plots per run and the forest plot across runs (summary.png is named after --summary: sum.png); the
    # across-runs table and its averages, then per run the compact table and every column (collapsed)
    assert page.count("data:image/png;base64,") == 9 and page.count("<table") == 6 and "mr2_uniform" in page
    assert page.count("<details><summary>Every column") == 2 and "`" not in page
    assert "alt='sum.png'" in page
    # one run, --no-plots then --html: a report.html in the run folder with its table and 4 images
    r = CliRunner().invoke(app, ["report", str(a), "--html"])
    assert r.exit_code == 0, r.output
    single = (a / "report.html").read_text()
    assert single.count("data:image/png;base64,") == 4 and "47.50 ± 3.54" in single


def test_variability_skipped_without_mr2_and_no_plots(tmp_path: Path) -> None:
    d = write_results(tmp_path / "run", {"ce": ACC["ce"], "focal": ACC["mr2_uniform"]})
    (d / "variability.png").write_bytes(b"stale")
    r = CliRunner().invoke(app, ["report", str(d)])
    assert r.exit_code == 0, r.output
    assert "variability.png skipped" in r.output and not (d / "variability.png").exists()
    assert (d / "tradeoff.png").exists()
    e = write_results(tmp_path / "noplots")
    assert CliRunner().invoke(app, ["report", str(e), "--no-plots"]).exit_code == 0
    assert not list(e.glob("*.png")) and (e / "table.tex").exists()


@pytest.mark.slow
def test_bad_run_dirs_exit_2_one_line(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "results.json").write_text("{not json")
    malformed = write_results(tmp_path / "malformed")
    res = json.loads((malformed / "results.json").read_text())
    res["runs"][0]["per_class_acc"] = [0.5]
    (malformed / "results.json").write_text(json.dumps(res))
    good = write_results(tmp_path / "good")
    for args, needle in (([str(tmp_path / "missing")], "not found"), ([str(corrupt)], "not valid JSON"),
                         ([str(malformed)], "malformed"), ([str(good), str(corrupt)], "not valid JSON")):
        r = run_cli("report", *args, timeout=120)
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], (args, r.stderr)
    assert not (good / "table.md").exists()  # nothing written when one of the folders is bad


def test_markdown_table_of_a_frame_without_rows():
    """A suite whose only method is the reference has no averages rows: the table is its header alone."""
    import pandas as pd

    from mr2probe.report import markdown_table
    text = pd.DataFrame({"ΔHard": pd.Series([], dtype=float)}, index=pd.Index([], name="method"))
    bold = pd.DataFrame({"ΔHard": pd.Series([], dtype=bool)}, index=text.index)
    assert markdown_table(text, bold).splitlines()[0].split("|")[1:3] == [" method   ", " ΔHard   "]
