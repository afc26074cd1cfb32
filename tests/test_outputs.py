"""What a reader meets around the table: the compact terminal table (≤ 100 characters) and its legend, --wide,
the HTML page (compact table first, every column collapsed; rendered by headless Chromium when installed), the long
exports (metrics.csv, per_class.csv) and the ASCII CSV names, plots whose text stays inside the figure, and the
small defects around train / import / predict / bench."""
from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from typer.testing import CliRunner

from conftest import ROOT, md_rows, run_cli
from mr2probe import plots
from mr2probe.cli import app
from mr2probe.csvnames import CSV_BASES, csv_labels, csv_name
from mr2probe.report import (COMPACT, RUN_FILES, load_predictions, load_results, report_run, run_report, summarize,
                             table_columns, terminal_table)
from test_report import ACC, write_results

REAL = ROOT / "results" / "offline" / "mnist-efficientnet-lite0-linear"  # 18 methods × 3 seeds, with predictions


@pytest.fixture(scope="module")
def real_summary():
    return summarize(load_results(REAL), load_predictions(REAL))


def test_compact_terminal_table_fits_100_columns_and_wide_has_every_column(real_summary) -> None:
    s = real_summary
    text = terminal_table(s)
    lines = text.splitlines()
    assert max(map(len, lines)) <= 100, max(lines, key=len)
    header = next(line for line in lines if line.lstrip().startswith("method"))
    assert header.split()[:4] == ["method", "All", "Hard", "Worst"] and header.split()[-3:] == ["CI]", "verdict", "q"]
    assert len(s.methods) == 18 and all(any(line.split()[:1] == [m] for line in lines) for m in s.methods)
    legend = lines[-3:]
    assert legend[0].startswith("% of test") and "verdicts:" in legend[1] and "protocol" in legend[2]
    assert "ldam" in text and re.search(r"ldam\s+97\.61\s+96\.37\s+95\.40\s+\+0\.27 \[", text)  # means, ΔHard [CI]
    wide = terminal_table(s, wide=True)
    head = next(line for line in wide.splitlines() if line.lstrip().startswith("method"))
    assert all(c.split()[0] in head for c in table_columns(s)) and "± " in wide
    assert COMPACT[:3] == ["All", "Hard", "Worst"]


def test_markdown_legend_above_every_column_and_html_compact_first(tmp_path: Path) -> None:
    d = write_results(ROOT / "runs" / "pytest-outputs" / tmp_path.name)  # inside the source: a relative link
    try:
        rep = report_run(d, html_file=True)
        md = (d / "table.md").read_text()
        top = md.split("\n\n")
        assert len(top[1].splitlines()) == 3 and "[protocol](../../../docs/protocol.md)" in top[1]
        assert (d / "../../../docs/protocol.md").resolve().is_file()
        assert list(md_rows(md, "method")[0])[:4] == ["method", "All", "mAcc", "Easy"]
        assert "How this table was made: mean ± sample SD" in md
        page = (d / "report.html").read_text()
        first = page[page.index("<table"):page.index("</table>")]
        assert re.findall(r"<th>(.*?)</th>", first) == ["method", "All", "Hard", "Worst", "ΔHard [95% CI]",
                                                         "verdict", "q"]
        assert "position:sticky" in page and "white-space:nowrap" in page and "<details><summary>Every column" in page
        assert "`" not in page and "<a href='../../../docs/protocol.md'>protocol</a>" in page
        assert rep.summary.head == "linear"
    finally:
        shutil.rmtree(d)


def test_long_exports_agree_with_the_table(tmp_path: Path) -> None:
    d = tmp_path / "run"
    shutil.copytree(REAL, d, ignore=shutil.ignore_patterns("*.png"))
    rep = report_run(d)
    s = rep.summary
    assert {"metrics.csv", "per_class.csv"} <= {p.name for p in d.iterdir()} and "per_class.csv" in RUN_FILES
    metrics = pd.read_csv(d / "metrics.csv")
    assert list(metrics.columns) == ["run", "method", "seed", "episode", "metric", "value"]
    table = pd.read_csv(d / "table.csv").set_index("method")
    means = metrics.groupby(["method", "metric"])["value"].mean().unstack()
    for col in ("hard", "delta_hard", "all", "hard_prec"):
        assert np.allclose(means.loc[table.index, col], table[col], atol=1e-3), col
    per_class = pd.read_csv(d / "per_class.csv")
    assert list(per_class.columns) == ["run", "method", "seed", "episode", "class", "class_name", "split", "metric",
                                       "value"]
    assert set(per_class["metric"]) == {"accuracy", "precision", "prediction_rate"}
    assert set(per_class["split"]) == {"test", "val"}
    results = json.loads((d / "results.json").read_text())
    run = results["runs"][0]
    got = per_class[(per_class.method == run["method"]) & (per_class.seed == run["seed"])
                    & (per_class.split == "test") & (per_class.metric == "accuracy")].sort_values("class")
    assert np.allclose(got["value"], 100 * np.array(run["per_class_acc"]), atol=1e-3)
    assert len(per_class) == sum(len(s.seeds[m]) for m in s.methods) * len(s.class_names) * 4
    for name in ("table.csv", "metrics.csv", "per_class.csv"):
        assert all(c.isascii() for c in next(csv.reader((d / name).open()))), name


def test_csv_names_are_ascii_invertible_and_documented() -> None:
    labels = CSV_BASES + ["ΔHard_ci_lo", "HardPrec_sd", "ΔHard_q_all", "verdict (all)", "q (all)"]
    names = [csv_name(c) for c in labels]
    assert all(re.fullmatch(r"[a-z0-9_]+", n) for n in names) and len(set(names)) == len(names)
    assert csv_name("ΔHard") == "delta_hard" and csv_name("Sig↑") == "sig_up" and csv_name("mAcc") == "m_acc"
    back = csv_labels(pd.DataFrame(columns=names + ["run", "method", "equivalent"])).columns.tolist()
    assert back[:len(CSV_BASES) + 3] == CSV_BASES + ["ΔHard_ci_lo", "HardPrec_sd", "ΔHard_q_all"]
    assert back[-3:] == ["run", "method", "equivalent"]
    doc = (ROOT / "docs" / "commands.md").read_text()
    for label in CSV_BASES:  # the map from the tables' labels to the CSV names, in the docs
        assert f"| {label} | `{csv_name(label)}` |" in doc, label


def _texts_inside(fig) -> list[str]:
    """The texts of a drawn figure (titles, labels, annotations, legends; not the tick labels, which matplotlib
    keeps for ticks outside the view too) that reach outside it (clipped in the PNG)."""
    fig.canvas.draw()
    box = fig.bbox
    r = fig.canvas.get_renderer()
    ticks = {id(x) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)
             for x in axis.get_ticklabels(which="both") + [axis.get_offset_text()]}
    out = []
    for t in fig.findobj(lambda a: hasattr(a, "get_text") and hasattr(a, "get_window_extent")):
        if not t.get_visible() or not t.get_text().strip() or id(t) in ticks:
            continue
        e = t.get_window_extent(r)
        if e.x0 < box.x0 - 1 or e.x1 > box.x1 + 1 or e.y0 < box.y0 - 1 or e.y1 > box.y1 + 1:
            out.append(t.get_text())
    return out


def test_plots_keep_their_text_inside_and_summary_png_says_what_it_shows(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    drawn = {}
    save = plots._save

    def keep(fig, path):
        drawn[Path(path).name] = fig
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    runs = []
    for name in ("mnist-dinov2-s14-linear", "mnist-efficientnet-lite0-linear"):
        shutil.copytree(REAL.parent / name, tmp_path / name, ignore=shutil.ignore_patterns("*.png"))
        runs.append(tmp_path / name)
    run_report(runs, plots=True)
    assert {"per_class.png", "groups.png", "variability.png", "tradeoff.png", "summary.png"} <= set(drawn)
    for name, fig in drawn.items():
        assert _texts_inside(fig) == [], name
        with Image.open(tmp_path / (name if name == "summary.png" else f"{runs[1].name}/{name}")) as im:
            assert 600 <= im.size[0] <= 3000 and 400 <= im.size[1] <= 4000, (name, im.size)
    ax = drawn["summary.png"].axes[0]
    assert ax.get_title(loc="left").startswith("ΔHard of every method") and "two-stage SE" in ax.get_xlabel()
    assert "bootstrap CI" not in ax.get_xlabel()


@pytest.mark.slow
def test_html_renders_in_headless_chromium(tmp_path: Path) -> None:
    browser = shutil.which("chromium-headless-shell") or shutil.which("chromium")
    if browser is None:
        pytest.skip("no headless Chromium (apt-get install chromium-headless-shell)")
    d = write_results(tmp_path / "run")
    report_run(d, plots=True, html_file=True)
    shot = tmp_path / "shot.png"
    subprocess.run([browser, "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1200,900",
                    f"--screenshot={shot}", (d / "report.html").as_uri()], capture_output=True, timeout=120)
    with Image.open(shot) as im:
        assert im.size == (1200, 900)
        grey = np.asarray(im.convert("L"), dtype=float)
    assert grey.std() > 20 and (grey < 100).mean() > 0.005  # text and rules drawn, not a blank page


def test_help_shows_brackets_as_written() -> None:
    r = CliRunner().invoke(app, ["extract", "--help"], terminal_width=200)
    assert "float16 or float32. [float16]" in " ".join(r.output.split())
    r = CliRunner().invoke(app, ["bench", "--help"], terminal_width=200)
    assert "[[runs]]" in r.output and "\\[" not in r.output


def test_cli_reference_escapes_brackets_once(tmp_path: Path) -> None:
    """The generated CLI reference: a bracket in help text is escaped once for markdown (renders as written)."""
    subprocess.run([sys.executable, str(ROOT / "docs" / "gen_reference.py"), str(tmp_path)], check=True,
                   capture_output=True, timeout=120)
    page = (tmp_path / "reference" / "cli.md").read_text()
    assert "every \\[\\[runs\\]\\] entry" in page and "\\\\[" not in page
    assert "float16 or float32. \\[float16\\]" in page


def test_print_config_round_trips_and_flags_win(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["train", "--print-config", "--lr", "0.5", "--set", "mr2.p=2"])
    assert r.exit_code == 0, r.output
    text = r.output
    assert text.startswith("[train]\n") and "lr = [0.5]" in text and "set = { mr2 = { p = 2 } }" in text
    cfg = tmp_path / "run.toml"
    cfg.write_text(text.replace("epochs = 30", "epochs = 7"))
    r = CliRunner().invoke(app, ["train", "--config", str(cfg), "--epochs", "9", "--set", "mr2.lam=0.5",
                                 "--print-config"])
    assert r.exit_code == 0, r.output
    assert "epochs = 9" in r.output and "lr = [0.5]" in r.output  # the flag wins; the file's lr stays
    assert "set = { mr2 = { p = 2, lam = 0.5 } }" in r.output
    again = tmp_path / "again.toml"
    again.write_text(r.output)
    r2 = CliRunner().invoke(app, ["train", "--config", str(again), "--print-config"])
    assert r2.output == r.output
    bad = tmp_path / "bad.toml"
    bad.write_text("[train]\nepochs = 'many'\n")
    r = run_cli("train", "--config", str(bad), "--print-config")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "epochs must be an integer" in r.stderr


def test_retraining_clears_old_plots_and_says_who_is_the_reference(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "report.html").write_text("<p>an older run's methods</p>")
    (out / "per_class.png").write_bytes(b"old")
    r = run_cli("train", "--methods", "mr2,logreg", "--seeds", "1", "--epochs", "1", "--min-steps", "20",
                "--no-null", "--lr", "0.01", "--wd", "0.0001", "--no-method-grid", "--out", str(out), "-q")
    assert r.returncode == 0, r.stderr
    assert "the reference ce is not among --methods: mr2 is the reference" in r.stderr
    assert not (out / "report.html").exists() and not (out / "per_class.png").exists()
    assert "removed per_class.png, report.html" in r.stderr
    r = run_cli("predict", str(out), "--features", str(ROOT / "mr2probe" / "data" / "fmnist-effl0-small.h5"),
                "--out", str(tmp_path / "p.csv"))
    assert r.returncode == 0, r.stderr
    assert "not predicted: logreg" in r.stderr and list(pd.read_csv(tmp_path / "p.csv").columns) == [
        "index", "source", "label", "mr2/0"]


def test_import_refuses_a_class_without_train_rows(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    src = tmp_path / "f.npz"
    np.savez(src, train_features=rng.normal(size=(6, 4)).astype(np.float32), train_labels=np.array([0, 0, 1, 1, 0, 1]),
             test_features=rng.normal(size=(3, 4)).astype(np.float32), test_labels=np.array([0, 1, 2]))
    r = run_cli("import", str(src), "--out", str(tmp_path / "f.h5"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "class 2 of the 3 classes have no train rows" in r.stderr
    assert not (tmp_path / "f.h5").exists()


def test_suite_paths_are_read_beside_the_suite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mr2probe.bench import load_suite

    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "mine.toml").write_text('encoder = "efficientnet-lite0"\nbatch_size = 8\n')
    suite = tmp_path / "suites" / "s.toml"
    suite.write_text('datasets = ["fashion-mnist"]\nencoders = ["mine.toml"]\nmethods = ["ce"]\n'
                     '[[runs]]\nname = "own"\nfeatures = "feats.h5"\n[[runs]]\nname = "later"\n'
                     'features = "features/made-later.h5"\n')
    (tmp_path / "suites" / "feats.h5").write_bytes(b"")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    s = load_suite(suite)
    assert s.encoders[0].settings["batch_size"] == 8
    assert Path(s.runs[0].features) == tmp_path / "suites" / "feats.h5"
    assert s.runs[1].features == "features/made-later.h5"  # not beside the suite: as written
    monkeypatch.chdir(ROOT)  # the shipped suites name extract/*.toml from the repository root
    assert load_suite(ROOT / "benchmarks" / "smoke.toml").encoders[0].label == "efficientnet-lite0"


def test_hand_results_across_runs_have_a_head_column(tmp_path: Path) -> None:
    a = write_results(tmp_path / "runs" / "lin")
    b = write_results(tmp_path / "runs" / "cos", ACC, head="cosine")
    run_report([a, b], plots=False)
    rows = md_rows((tmp_path / "runs" / "summary.md").read_text(), "run")
    assert {(r["run"], r["head"]) for r in rows} == {("lin", "linear"), ("cos", "cosine")}
