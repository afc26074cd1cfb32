"""Per-class instruments in the report, on hand-computable runs: HardPrec / HardRate revealing recall bought by
over-predicting the hard classes, the hard classes' top confusions, the minimum detectable ΔHard, the Jaccard
stability of the hard set (over seeds and across runs of one dataset), the columns in every table format and
summary.json, runs without predictions.npz, and choices at an end of their val grid (the metrics themselves:
test_metrics_instruments.py)."""
from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import md_rows
from mr2probe.bench import CellResult, Suite, write_summary
from mr2probe.csvnames import csv_name
from mr2probe.metrics import (COLUMNS, DELTA_COLUMNS, confusion, hard_instruments, per_class_accuracy)
from mr2probe.report import (load_predictions, load_results, report_run, run_report, to_csv, to_html, to_latex,
                             to_markdown)
from mr2probe.results import RunRecord
from mr2probe.summary import hard_set_stability, summarize

K, N = 6, 20  # classes, test images per class


def predict(acc: list[float], to: int = 1) -> np.ndarray:
    """Test predictions (labels np.repeat(arange(K), N)): the first round(acc_k · N) images of class k right,
    the rest predicted as class (k + to) % K."""
    y = np.repeat(np.arange(K), N)
    right = np.concatenate([np.arange(N) < round(a * N) for a in acc])
    return np.where(right, y, (y + to) % K)


REF = [0.9, 0.5, 0.9, 0.5, 0.9, 0.9]  # ce: hard = {1, 3}, easy = {4, 5} (stable ranking), medium = {0, 2}


def overpredict() -> np.ndarray:
    """Predicts only the hard classes 1 and 3: right on all of their images, every other image alternately 1, 3."""
    y = np.repeat(np.arange(K), N)
    other = np.where(np.arange(len(y)) % 2 == 0, 1, 3)
    return np.where((y == 1) | (y == 3), y, other)


def mixed() -> np.ndarray:
    """Right everywhere except hard class 3: 10 right, 5 → 4, 3 → 5, 1 → 0, 1 → 2."""
    y = np.repeat(np.arange(K), N)
    pred = y.copy()
    pred[y == 3] = [3] * 10 + [4] * 5 + [5] * 3 + [0, 2]
    return pred


def write_run(run_dir: Path, preds: dict[str, list[np.ndarray]], with_predictions: bool = True,
              dataset: str = "hand_ds", encoder: str = "hand_enc", seeds: dict[str, list[int]] | None = None
              ) -> Path:
    """results.json (per_class_acc from the predictions; val = test accuracy) and predictions.npz."""
    y = np.repeat(np.arange(K), N)
    runs, npz = [], {"test_labels": y}
    for method, per_seed in preds.items():
        for i, p in enumerate(per_seed):
            seed = (seeds or {}).get(method, list(range(len(per_seed))))[i]
            acc = per_class_accuracy(p, y, K).tolist()
            runs.append({"method": method, "seed": seed, "hparams": {}, "per_class_acc": acc,
                         "val_per_class_acc": acc, "val_score": float(np.mean(p == y))})
            npz[f"{method}/{seed}"] = p
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "results.json").write_text(json.dumps({
        "class_names": [f"c{i}" for i in range(K)], "test_class_counts": [N] * K, "reference": "ce",
        "head": "linear", "adapter": "none", "provenance": {"encoder": encoder, "dataset": dataset}, "runs": runs}))
    if with_predictions:
        np.savez(run_dir / "predictions.npz", **{k.replace("/", "__"): v for k, v in npz.items()})
    return run_dir


def hand_run(run_dir: Path, with_predictions: bool = True) -> Path:
    """ce (2 seeds), its null control (seeds 2, 3: seed 3 one more error in hard class 1), overpredict, mixed."""
    null1 = predict(REF)
    null1[N + 9] = 2  # class 1, image 9: ce is right on it (first 10 right)
    return write_run(run_dir, {"ce": [predict(REF)] * 2, "ce (null)": [predict(REF), null1],
                               "overpredict": [overpredict()] * 2, "mixed": [mixed()] * 2},
                     with_predictions, seeds={"ce (null)": [2, 3]})


# ---- the table model ------------------------------------------------------------------------------------------

def test_hardprec_reveals_recall_bought_by_over_prediction(tmp_path: Path) -> None:
    d = hand_run(tmp_path / "run")
    s = summarize(load_results(d), load_predictions(d))
    assert s.groups.hard.tolist() == [1, 3]
    # overpredict: all of the hard classes' images right → Hard 100, ΔHard +50, but each hard class is predicted
    # 60 times (its 20 + half of the other 80) for 20 images: precision 1/3, rate / share 3
    assert s.mean["overpredict"]["Hard"] == pytest.approx(100.0) and s.mean["overpredict"]["ΔHard"] == 50.0
    assert s.mean["overpredict"]["HardPrec"] == pytest.approx(100 / 3)
    assert s.mean["overpredict"]["HardRate"] == pytest.approx(3.0)
    # ce: class 1 predicted 10 (own) + 2 (class 0's errors) = 12 times, 10 right; the same for class 3
    assert s.mean["ce"]["HardPrec"] == pytest.approx(100 * 10 / 12) and s.mean["ce"]["HardRate"] == pytest.approx(0.6)
    assert s.std["ce"]["HardPrec"] == 0.0
    assert s.best("Hard") == {"overpredict"} and s.best("HardPrec") == {"mixed"}  # mixed: never over-predicts
    # per class over all of test, mean over seeds
    assert s.precision["overpredict"].mean(0)[[1, 3]] == pytest.approx([1 / 3, 1 / 3])
    assert s.pred_rate["overpredict"].mean(0) == pytest.approx([0, 0.5, 0, 0.5, 0, 0])
    assert s.share == pytest.approx([1 / K] * K)
    # per-class tests against ce: overpredict better on 10 images of each hard class (p = 2 / 2^10), worse on
    # the 18 ce gets right of every other class (p = 2 / 2^18); all 6 survive BH
    sig = s.significance["overpredict"]
    assert sig["p"][1] == pytest.approx(2 / 2 ** 10) and sig["p"][0] == pytest.approx(2 / 2 ** 18)
    assert sig["delta_acc"].tolist() == pytest.approx([-90, 50, -90, 50, -90, -90])
    assert s.sig_counts("overpredict") == (2, 4) and s.sig_counts("ce") is None
    # mixed: right on class 3's first 10 images as ce → no discordant pair there; better on class 1's 10 ce
    # errors (p = 2 / 2^10, q = 6p) and on the 2 ce errors of classes 0, 2, 4, 5 (p = 0.5): one class up
    mx = s.significance["mixed"]
    assert mx["p"].tolist() == pytest.approx([0.5, 2 / 2 ** 10, 0.5, 1.0, 0.5, 0.5])
    assert mx["q"][1] == pytest.approx(6 * 2 / 2 ** 10) and s.sig_counts("mixed") == (1, 0)


def test_top_confusions_of_the_hard_classes(tmp_path: Path) -> None:
    d = hand_run(tmp_path / "run")
    s = summarize(load_results(d), load_predictions(d))
    by_class = {e["class"]: e for e in s.confusions["mixed"]}
    c3 = by_class["c3"]
    assert list(by_class) == ["c1", "c3"] and c3["test_images"] == N and c3["seeds"] == 2 and c3["errors"] == 20
    # summed over 2 seeds: 5 → c4, 3 → c5, then a tie of 1 between c0 and c2 broken by class index
    assert [(t["to"], t["count"]) for t in c3["top"]] == [("c4", 10), ("c5", 6), ("c0", 2)]
    assert [t["fraction"] for t in c3["top"]] == pytest.approx([0.25, 0.15, 0.05])
    assert by_class["c1"]["top"] == [] and by_class["c1"]["accuracy"] == 1.0
    ce1 = s.confusions["ce"][0]
    assert ce1["top"] == [{"to": "c2", "index": 2, "count": 20, "fraction": 0.5}] and ce1["accuracy"] == 0.5


def test_minimum_detectable_delta_hard_formula(tmp_path: Path) -> None:
    """The table's MDE is the null control's, from the two-stage SE of its ΔHard: (t_0.975,ν + t_0.8,ν) · SE; every
    method has its own; without a null control the median of the methods'."""
    from scipy import stats

    d = hand_run(tmp_path / "run")
    s = summarize(load_results(d), load_predictions(d))
    assert s.per_seed["ce (null)"]["ΔHard"].tolist() == pytest.approx([0.0, -2.5])
    e = s.inference["ce (null)"]["ΔHard"]
    df = e["df"] if e["df"] is not None else math.inf
    t = stats.t(df) if math.isfinite(df) else stats.norm()
    assert s.mde["source"] == "null control"
    assert s.mde["value"] == pytest.approx((t.ppf(0.975) + t.ppf(0.8)) * e["se"])
    assert e["se"] ** 2 == pytest.approx(e["se_train"] ** 2 + e["se_image"] ** 2)
    assert set(s.mde["per_method"]) == set(s.methods) - {"ce"}
    assert f"Minimum detectable ΔHard (80% power, α = 0.05): {s.mde['value']:.2f} points (the null control's" in \
        to_markdown(s)
    no_null = summarize(load_results(d), load_predictions(d), null=False)
    assert no_null.mde["source"] == "methods" and no_null.mde["value"] == pytest.approx(
        np.median(list(no_null.mde["per_method"].values())))


def test_crossfit_hardprec_averages_the_folds(tmp_path: Path) -> None:
    d = hand_run(tmp_path / "run")
    results, preds = load_results(d), load_predictions(d)
    s = summarize(results, preds, "crossfit")
    y = preds["test_labels"]
    for m in ("ce", "overpredict"):
        p = preds[f"{m}/0"]
        parts = [hard_instruments(confusion(p[f.rows], y[f.rows], K), f.groups.hard) for f in s.folds]
        assert s.per_seed[m]["HardPrec"][0] == pytest.approx(np.mean([x["HardPrec"] for x in parts]))
        assert s.per_seed[m]["HardRate"][0] == pytest.approx(np.mean([x["HardRate"] for x in parts]))


# ---- rendering -----------------------------------------------------------------------------------------------

def test_new_columns_in_markdown_csv_latex_html_and_summary_json(tmp_path: Path) -> None:
    d = hand_run(tmp_path / "run")
    rep = report_run(d, html_file=True)
    s = rep.summary
    table = md_rows(rep.markdown, "method")
    cols = list(table[0])
    assert cols[:1 + len(COLUMNS + DELTA_COLUMNS)] == ["method"] + COLUMNS + DELTA_COLUMNS
    n = 1 + len(COLUMNS + DELTA_COLUMNS)
    assert cols[n:n + 3] == ["HardPrec", "HardRate", "Sig↑/↓"] and cols[n + 3] == "All 95% CI"
    assert cols[-2:] == ["ΔHard q", "verdict"]
    cells = next(r for r in table if r["method"] == "overpredict")
    assert cells["HardPrec"] == "33.33 ± 0.00" and cells["HardRate"] == "3.00 ± 0.00" and cells["Sig↑/↓"] == "2 / 4"
    assert "Hard-set stability across seeds (ce, each seed ranked on its own val accuracy): mean pairwise " \
           "Jaccard 1.00 over 2 seeds (1 pair)" in rep.markdown
    assert (d / "table.md").read_text() == rep.markdown

    rows = list(csv.DictReader((d / "table.csv").open()))  # ASCII names (mr2probe.csvnames)
    assert {"hard_prec", "hard_rate", "hard_prec_sd", "hard_rate_sd", "sig_up", "sig_down"} <= set(rows[0])
    over = next(r for r in rows if r["method"] == "overpredict")
    assert over["hard_prec"] == "33.3333" and over["sig_up"] == "2" and over["sig_down"] == "4"
    assert next(r for r in rows if r["method"] == "ce")["sig_up"] == ""

    tex = to_latex(s)
    assert "HardPrec & HardRate & Sig$\\uparrow$/$\\downarrow$" in tex and "Minimum detectable" in tex
    body = [line for line in tex.splitlines() if line.startswith("overpredict &")][0]
    assert len(body.split(" & ")) == 1 + len(COLUMNS + DELTA_COLUMNS) + 5 and "33.33 $\\pm$ 0.00" in body

    page = re.sub(r">\s+<", "><", (d / "report.html").read_text())
    assert "<th>HardPrec</th><th>HardRate</th><th>Sig↑/↓</th>" in page and "Minimum detectable ΔHard" in page
    assert "Top confusions of the hard classes" in page and "→ c4: 10 (25.0%)" in page
    assert page.count("<table") == 3  # the compact table, every column (collapsed) and the confusions
    assert "<th>ce (null)</th>" not in page.split("Top confusions")[1]  # the null control left out there

    js = json.loads((d / "summary.json").read_text())
    assert js["mean"]["overpredict"]["HardPrec"] == 33.3333  # six significant digits
    assert js["minimum_detectable_delta_hard"]["source"] == "null control"
    assert js["hard_set_stability_seeds"]["value"] == 1.0
    ins = js["instruments"]
    assert ins["per_class"]["overpredict"]["rate_over_share"] == pytest.approx([0, 3, 0, 3, 0, 0])
    assert ins["per_class"]["ce"]["precision"][1] == pytest.approx(10 / 12, rel=1e-5)
    assert ins["significance"]["overpredict"]["up"] == 2 and ins["significance"]["overpredict"]["down"] == 4
    assert len(ins["significance"]["mixed"]["q"]) == K and "ce" not in ins["significance"]
    assert ins["hard_confusions"]["mixed"][1]["top"][0] == {"to": "c4", "index": 4, "count": 10, "fraction": 0.25}
    assert set(ins["definitions"]) >= {"precision", "prediction_rate", "HardPrec", "HardRate", "significance",
                                       "mde", "hard_set_stability"}


def test_hard_set_stability_across_runs_and_bench_summary(tmp_path: Path) -> None:
    """Two runs of dataset A whose references find different hard sets ({1, 3} and {1, 2}: Jaccard 1/3) and one
    of dataset B: the block lists A only, in report's summary.md and in bench's summary.md."""
    a1 = hand_run(tmp_path / "runs" / "a1")
    a2 = write_run(tmp_path / "runs" / "a2", {"ce": [predict([0.9, 0.5, 0.5, 0.9, 0.9, 0.9])] * 2,
                                              "mr2": [predict([0.9, 0.6, 0.6, 0.9, 0.9, 0.9])] * 2})
    b = write_run(tmp_path / "runs" / "b", {"ce": [predict(REF)], "mr2": [predict(REF)]}, dataset="other_ds")
    text = run_report([a1, a2, b], plots=False)
    md = (tmp_path / "runs" / "summary.md").read_text()
    assert "Hard-set stability across runs of the same dataset" in md
    assert f"wrote {tmp_path / 'runs' / 'summary.md'}" in text
    assert "- hand_ds: mean 0.33 over 2 runs (a1 vs a2: 0.33)" in md and "other_ds" not in md.split("stability")[-1]
    reps = [(p.name, report_run(p).summary) for p in (a1, a2, b)]
    st = hard_set_stability(reps)
    assert list(st) == ["hand_ds"] and st["hand_ds"]["pairs"][0]["jaccard"] == pytest.approx(1 / 3)

    suite = Suite(path=tmp_path / "t.toml", datasets=["hand_ds"], encoders=[], methods=["ce"], heads=["linear"],
                  seeds=[0, 1])
    cells = [CellResult("hand_ds", "hand_enc", "linear", "done", "", p, s_) for (_, s_), p in zip(reps, (a1, a2, b))]
    summary = write_summary(suite, cells, tmp_path).read_text()
    table = md_rows(summary, "run")
    assert list(table[0])[-8:] == ["HardPrec", "HardRate", "Sig↑/↓", "ΔHard 95% CI", "ΔHard q", "verdict",
                                   "q (all)", "verdict (all)"]
    over = next(r for r in table if r["method"] == "overpredict" and r["run"] == "[a1](a1/table.md)")
    assert (over["HardPrec"], over["HardRate"], over["Sig↑/↓"]) == ("33.33 ± 0.00", "3.00 ± 0.00", "2 / 4")
    assert "- hand_ds: mean 0.33 over 2 runs (a1 vs a2: 0.33)" in summary
    assert "Minimum detectable ΔHard per run:" in summary


def test_across_runs_forest_plot_draws_every_non_reference_row(tmp_path: Path) -> None:
    """``report`` with several runs writes summary.png: one row per (run, method other than its reference)."""
    from mr2probe.plots import plot_across_runs

    a1 = hand_run(tmp_path / "runs" / "a1")
    a2 = write_run(tmp_path / "runs" / "a2", {"ce": [predict([0.9, 0.5, 0.5, 0.9, 0.9, 0.9])] * 2,
                                              "mr2": [predict([0.9, 0.6, 0.6, 0.9, 0.9, 0.9])] * 2})
    text = run_report([a1, a2], plots=True)
    png = tmp_path / "runs" / "summary.png"
    assert f"wrote {png}" in text and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    numbers = pd.read_csv(tmp_path / "runs" / "summary.csv")
    runs = numbers[numbers["scope"] == "run"]
    _, drawn = plot_across_runs(runs, tmp_path / "again.png")
    assert drawn == int((runs["method"] != runs["reference"]).sum()) > 0


def test_runs_without_predictions_still_report(tmp_path: Path) -> None:
    d = hand_run(tmp_path / "run", with_predictions=False)
    rep = report_run(d, html_file=True)
    s = rep.summary
    assert s.instrument_columns() == [] and s.significance == {} and s.confusions == {}
    header = next(line for line in rep.markdown.splitlines() if line.startswith("| method"))
    assert "HardPrec" not in header and "Sig" not in header
    assert "HardPrec, HardRate, Sig↑/↓: not shown (no predictions.npz in this run folder)" in rep.markdown
    assert "Minimum detectable ΔHard (80% power, α = 0.05)" in rep.markdown  # from the null's seed spread
    assert s.mde["source"] == "null control"
    cols = [csv_name(c) for c in COLUMNS + DELTA_COLUMNS]
    assert next(csv.reader((d / "table.csv").open()))[:3 + 2 * len(cols)] == (
        ["method"] + cols + [f"{c}_sd" for c in cols] + ["seeds", "groups_on"])
    assert "HardPrec &" not in to_latex(s) and "Top confusions" not in to_html([rep])
    js = json.loads((d / "summary.json").read_text())
    assert js["instruments"]["per_class"] == {} and js["instruments"]["test_share"] is None
    # one method with predictions and one without: the other's instrument cells are empty, nothing crashes
    preds = load_predictions(hand_run(tmp_path / "with"))
    partial = {k: v for k, v in preds.items() if not k.startswith("mixed/")}
    s = summarize(load_results(d), partial)
    assert "HardPrec" in s.mean["ce"] and "HardPrec" not in s.mean["mixed"] and "mixed" not in s.significance
    row = next(r for r in md_rows(to_markdown(s), "method") if r["method"] == "mixed")
    assert row["HardPrec"] == row["HardRate"] == row["Sig↑/↓"] == "" and row["Hard"]
    assert next(r for r in csv.DictReader(to_csv(s).splitlines()) if r["method"] == "mixed")["hard_prec"] == ""
    # a single seed and no predictions: no MDE, said so
    one = write_run(tmp_path / "one", {"ce": [predict(REF)], "mr2": [predict(REF)]}, with_predictions=False)
    assert "Minimum detectable ΔHard (80% power, α = 0.05): not available (needs 2 replicates" in \
        report_run(one).markdown


# ---- choices at an end of their val grid ---------------------------------------------------------------------

def _grid_run(seed: int, chosen: dict, scores: dict[tuple, float], names: tuple[str, ...] = ("scale", "lr")) -> dict:
    """A run whose val grid is ``scores`` ({(value of each name): val score}) and whose choice is ``chosen``."""
    grid = [{"hparams": dict(zip(names, k)), "val_score": v} for k, v in scores.items()]
    return {"seed": seed, "hparams": chosen, "grid": grid}


def test_grid_edges_flag_an_end_only_where_the_val_score_still_rises() -> None:
    from mr2probe.summary import grid_edges as edges_of

    def grid_edges(by_method: dict, *ceilings: dict) -> list[dict]:
        """The grid edges of runs given as results.json holds them."""
        return edges_of({m: [RunRecord.from_dict({"method": m, "per_class_acc": [], **r}) for r in runs]
                         for m, runs in by_method.items()}, *ceilings)

    three = {(8.0, 0.1): 0.80, (16.0, 0.1): 0.85, (32.0, 0.1): 0.86, (8.0, 1.0): 0.70, (16.0, 1.0): 0.70,
             (32.0, 1.0): 0.70}
    flat = {**three, (32.0, 0.1): 0.8505}  # +0.05 point over 16: not rising
    low = {(8.0, 0.1): 0.90, (16.0, 0.1): 0.80, (32.0, 0.1): 0.70}
    runs = {"ce": [_grid_run(0, {"scale": 32.0, "lr": 0.1}, three), _grid_run(1, {"scale": 32.0, "lr": 0.1}, flat)],
            "inside": [_grid_run(0, {"scale": 16.0, "lr": 0.1}, {**three, (16.0, 0.1): 0.9})],
            "low": [_grid_run(0, {"scale": 8.0, "lr": 0.1}, low)]}
    # a exact probe's grid records k only (its fixed temperature sits in hparams beside it); an upper end at
    # the number of training rows (the ceiling) cannot be widened
    knn = {"grid": [{"hparams": {"k": k}, "val_score": v} for k, v in ((10, 0.80), (20, 0.75), (50, 0.70))],
           "seed": 0, "hparams": {"k": 10, "temperature": 0.07, "weighting": "temperature"}}
    top = {**knn, "grid": [{"hparams": {"k": k}, "val_score": v} for k, v in ((10, 0.6), (20, 0.7), (50, 0.8))],
           "hparams": {"k": 50, "temperature": 0.07}}
    assert grid_edges({"knn": [knn, top]}, {"k": 50}) == [
        {"method": "knn", "param": "k", "end": "lowest", "value": 10, "grid_min": 10, "grid_max": 50, "runs": 1,
         "of": 2, "rise": pytest.approx(5.0)}]
    assert [r["runs"] for r in grid_edges({"knn": [top]}, {"k": 1000})] == [1]
    # exactly 0.1 point (6 of 6000 val images) is not "more than 0.1"
    exact = {(8.0, 0.1): 0.80, (16.0, 0.1): 5100 / 6000, (32.0, 0.1): 5106 / 6000}
    assert grid_edges({"ce": [_grid_run(0, {"scale": 32.0, "lr": 0.1}, exact)]}) == []
    rows = grid_edges(runs)
    # lr has two values (no inside): never flagged; the interior choice neither
    assert rows == [
        {"method": "ce", "param": "scale", "end": "highest", "value": 32.0, "grid_min": 8.0, "grid_max": 32.0,
         "runs": 1, "of": 2, "rise": pytest.approx(1.0)},
        {"method": "low", "param": "scale", "end": "lowest", "value": 8.0, "grid_min": 8.0, "grid_max": 32.0,
         "runs": 1, "of": 1, "rise": pytest.approx(10.0)}]


def test_the_reference_is_checked_against_logreg_under_every_table(tmp_path: Path) -> None:
    """protocol.md: a CE probe reaches the exact logistic regression within 0.5 pt. ce's All is 92/120 = 76.67 %;
    logreg 2 more images right (78.33 %, +1.67: flagged), the same (within) or 1 fewer (75.83 %: ce 0.83 above).
    The runs' val scores (here their test accuracy) give the same gap on val, which the line quotes beside."""
    from mr2probe.report import reference_check_line, terminal_table

    better = write_run(tmp_path / "better", {"ce": [predict(REF)] * 2,
                                             "logreg": [predict([0.9, 0.6, 0.9, 0.5, 0.9, 0.9])] * 2})
    rep = report_run(better)
    assert rep.summary.reference_check == {"probe": "logreg", "gap": pytest.approx(100 * 2 / 120),
                                           "tolerance": 0.5, "under_fit": True,
                                           "val_gap": pytest.approx(100 * 2 / 120), "steps": None,
                                           "calibrated": False, "reached": None, "checkpoints": None,
                                           "reference_checkpoints": []}
    line = reference_check_line(rep.summary)
    assert line.startswith("Reference check: logreg (exact L2 logistic regression, C on val) is +1.67 points above "
                           "ce on All (on val logreg +1.67), more than the protocol's 0.5: the reference may be "
                           "under-fit")
    assert line in rep.markdown and "may be under-fit" in " ".join(terminal_table(rep.summary).split())
    assert json.loads((better / "summary.json").read_text())["reference_check"]["under_fit"] is True
    same = report_run(write_run(tmp_path / "same", {"ce": [predict(REF)] * 2, "logreg": [predict(REF)] * 2}))
    line = reference_check_line(same.summary)
    assert line == ("Reference check: ce is within 0.5 point of logreg (exact L2 logistic regression, C on val) on "
                    "All (logreg +0.00; on val +0.00)") and line in same.markdown
    assert "under-fit" not in " ".join(terminal_table(same.summary).split())
    worse = report_run(write_run(tmp_path / "worse", {"ce": [predict(REF)] * 2,
                                                      "logreg": [predict([0.9, 0.5, 0.9, 0.5, 0.9, 0.85])] * 2}))
    assert reference_check_line(worse.summary) == ("Reference check: ce is 0.83 points above logreg (exact L2 "
                                                   "logistic regression, C on val) on All (on val logreg -0.83)")
    assert reference_check_line(report_run(hand_run(tmp_path / "plain")).summary) is None  # no logreg row
    # under the reach-logreg rule the line names the budget; when the budget reached logreg on val and test still
    # shows the gap, more steps are not the suggestion
    calibrated = {**rep.summary.reference_check, "steps": 2030, "calibrated": True}
    reached = reference_check_line(replace(rep.summary, reference_check={**calibrated, "reached": True}))
    assert "although the budget reached it on val (2030 steps by the reach-logreg rule, reached on val)" in reached
    assert "not too few steps" in reached and "may be under-fit" not in reached
    capped = reference_check_line(replace(rep.summary, reference_check={**calibrated, "reached": False}))
    assert capped.endswith("may be under-fit on these features (a larger step budget or grid; budget: 2030 steps by "
                           "the reach-logreg rule, its ceiling: not reached on val (raise --max-steps))")


def test_a_reference_at_the_end_of_its_grid_is_flagged_under_every_table(tmp_path: Path) -> None:
    from mr2probe.report import grid_edge_line, reference_edge_warning, terminal_table

    d = hand_run(tmp_path / "run")
    results = json.loads((d / "results.json").read_text())
    rising = {(8.0, 0.1): 0.80, (16.0, 0.1): 0.85, (32.0, 0.1): 0.87}
    for r in results["runs"]:
        if r["method"] in ("ce", "ce (null)"):
            r.update(_grid_run(r["seed"], {"scale": 32.0, "lr": 0.1}, rising))
    (d / "results.json").write_text(json.dumps(results))
    rep = report_run(d)
    warning = reference_edge_warning(rep.summary)
    assert warning.startswith("The reference ce chose scale = 32 (the highest of its grid, +2.00 points")
    assert "in 2/2 runs: it may be under-fit" in warning
    line = grid_edge_line(rep.summary)
    assert "scale = 32 (highest of 8…32): ce." in line and "(null)" not in line  # the null control left out
    assert line in rep.markdown and "under-fit" in " ".join(terminal_table(rep.summary).split())
    edges = json.loads((d / "summary.json").read_text())["grid_edges"]
    assert {(e["method"], e["runs"]) for e in edges} == {("ce", 2), ("ce (null)", 2)}
    # no grid: no line
    assert grid_edge_line(report_run(hand_run(tmp_path / "plain")).summary) is None
