"""Benchmark suites: a tiny real suite end to end (CLI), skipped cells, cached features on rerun, schema checks."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import BUNDLED, ROOT, md_rows, run_cli
from mr2probe.bench import load_suite, run_suite
from mr2probe.errors import UserError

MOCO = "mocov2:/nonexistent/moco_v2_800ep_pretrain.pth.tar"


def write_suite(tmp_path: Path, extra: str = "") -> Path:
    """fashion-mnist × EfficientNet-Lite0 runs (5 images per class); cifar100 has no data; MoCo no weights."""
    path = tmp_path / "tiny.toml"
    path.write_text(f"""
datasets = ["fashion-mnist", "cifar100"]
encoders = ["{ROOT / 'extract' / 'efficientnet-lite0.toml'}", "{MOCO}"]
methods = ["ce", "mr2"]
heads = ["linear"]
seeds = 1
{extra}
[roots]
cifar100 = "{tmp_path / 'no-such-folder'}"

[extract]
per_class = 5
workers = 0
batch_size = 50

[train]
epochs = 2
min_steps = 20
""")
    return path


@pytest.mark.slow
def test_suite_runs_skips_missing_cells_and_reuses_features(tmp_path: Path) -> None:
    suite, feats, out = write_suite(tmp_path), tmp_path / "features", tmp_path / "out"
    r = run_cli("bench", str(suite), "--features-dir", str(feats), "--out", str(out), "-q")
    assert r.returncode == 0, r.stderr
    skips = [line for line in r.stderr.splitlines() if line.startswith("skip ")]
    assert len(skips) == 3, r.stderr  # one line per skipped cell
    assert sum("cifar100 × efficientnet-lite0: missing data" in s and "no-such-folder" in s for s in skips) == 1
    assert sum("fashion-mnist × mocov2" in s and "not found" in s for s in skips) == 1

    run_dir = out / "fashion-mnist-efficientnet-lite0-linear"
    results = json.loads((run_dir / "results.json").read_text())
    assert {(x["method"], x["seed"]) for x in results["runs"]} == {("ce", 0), ("mr2", 0), ("ce (null)", 1)}
    assert results["provenance"]["splits"]["test"] == 50 and results["config"]["train"]["epochs"] == 2
    assert "mr2" in [r["method"] for r in md_rows((run_dir / "table.md").read_text(), "method")]
    for png in ("per_class.png", "groups.png", "variability.png", "tradeoff.png"):  # the report's plots too
        assert (run_dir / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    assert sorted(p.name for p in out.iterdir()) == ["fashion-mnist-efficientnet-lite0-linear", "summary.csv",
                                                     "summary.md", "summary.png"]
    summary = (out / "summary.md").read_text()
    cells = md_rows(summary, "run")
    assert {(r["dataset"], r["encoder"], r["method"]) for r in cells} == {
        ("fashion-mnist", "efficientnet-lite0", m) for m in ("ce", "mr2", "ce (null)")}
    assert "## Skipped cells" in summary
    assert summary.count("- cifar100 × ") == 2 and summary.count("- fashion-mnist × mocov2") == 1

    h5 = feats / "fashion-mnist-efficientnet-lite0-pc5.h5"
    before = h5.stat().st_mtime_ns
    logs: list[str] = []
    cells = run_suite(load_suite(suite), features_dir=feats, out=out, progress=False, log=logs.append)
    assert h5.stat().st_mtime_ns == before
    assert any("features cached" in m for m in logs)
    assert [c.status for c in cells].count("done") == 1 and [c.status for c in cells].count("skipped") == 3


@pytest.mark.parametrize("extra, message", [
    ("typo = 1", "unknown key(s) typo"),
    ("[train.more]\nx = 1", "[train]: unknown key(s) more"),
    ('methods_x = "all"', "unknown key(s) methods_x"),
])
def test_unknown_keys_are_refused(tmp_path: Path, extra: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(f'datasets = ["fashion-mnist"]\nencoders = ["efficientnet-lite0"]\n{extra}\n')
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        load_suite(path)


@pytest.mark.parametrize("body, message", [
    ('datasets = ["nope"]\nencoders = ["efficientnet-lite0"]', "unknown dataset 'nope'"),
    ('datasets = ["mnist"]\nencoders = ["nope"]', "neither a recipe file"),
    ('datasets = ["mnist"]\nencoders = ["efficientnet-lite0"]\nmethods = ["ce", "nope"]', "unknown method 'nope'"),
    ('datasets = ["mnist"]\nencoders = ["efficientnet-lite0"]\n[train]\nepochs = "2"', "epochs must be an integer"),
    ('datasets = ["mnist"]\nencoders = ["efficientnet-lite0"]\n[train]\nset = { mr2 = { q = 1 } }',
     "no hyperparameter q"),
    ('datasets = ["mnist"]\nencoders = ["efficientnet-lite0"]\n[roots]\ncifar100 = "/x"', "unknown key"),
    ('datasets = ["mnist"]\nencoders = ["efficientnet-lite0"]\n[extract]\nper_class = 0', "per_class must be ≥ 1"),
    ('datasets = ["mnist"]\nencoders = ["efficientnet-lite0"]\nseeds = 0', "seeds must be a count"),
    ('datasets = ["mnist"]\nencoders = ["efficientnet-lite0"]\n[train]\ngroups_on = "train"',
     "groups_on must be one of val"),
])
def test_bad_suites_are_refused_before_any_work(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(body + "\n")
    with pytest.raises(UserError, match=message):
        load_suite(path)


def test_shipped_suites_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # recipe paths are relative to the repository root
    paper = load_suite("benchmarks/paper.toml")
    assert len(paper.datasets) == 7 and [e.label for e in paper.encoders] == ["mae-vit-b16", "mocov2-r50",
                                                                               "clip-vit-b16"]
    assert paper.heads == ["linear", "cosine"] and paper.seeds == [0, 1, 2]
    assert "supcon" in paper.skipped_methods and "supcon" not in paper.methods and "mr2" in paper.methods
    offline = load_suite("benchmarks/offline.toml")
    assert offline.datasets == ["fashion-mnist", "mnist"] and offline.methods == paper.methods
    assert [e.label for e in offline.encoders] == ["efficientnet-lite0", "dinov2-s14"]
    settings = load_suite("benchmarks/settings.toml")
    assert settings.profiles == ["full", "longtail:100", "longtail:10", "shots:20", "shots:5"]
    assert {"logreg", "knn", "mr2", "ldam"} <= set(settings.methods) and settings.train["episodes"] == 5
    assert settings.encoders == offline.encoders and settings.heads == ["linear", "cosine"]
    smoke = load_suite("benchmarks/smoke.toml")
    assert smoke.extract["per_class"] == 5 and smoke.train["epochs"] == 2


def test_train_q_and_bench_share_seed_parts() -> None:
    """A seed's part key ignores how the run is shown (progress bars) and how the heads are chunked, not what it
    computes."""
    from dataclasses import replace

    from mr2probe.experiment import ExperimentConfig, _config_key
    from mr2probe.heads import ProbeConfig
    from mr2probe.trainer import TrainConfig

    cfg = ExperimentConfig(features=Path("f.h5"), out=Path("o"), methods=["ce", "mr2"], seeds=[0],
                           train=TrainConfig(min_steps=0, progress=True))
    quiet = replace(cfg, train=replace(cfg.train, progress=False))
    other = replace(cfg, train=replace(cfg.train, epochs=cfg.train.epochs + 1))
    unchunked = replace(cfg, train=replace(cfg.train, chunk_mib=0))  # how the CPU groups heads: the same numbers
    assert _config_key(cfg, "abc") == _config_key(quiet, "abc") == _config_key(unchunked, "abc")
    assert _config_key(cfg, "abc") != _config_key(other, "abc")
    assert _config_key(cfg, "abc") != _config_key(cfg, "abd")
    # the cosine scale grid is in a cosine head's key only (a linear head's numbers do not depend on it)
    wide = replace(cfg, train=replace(cfg.train, scale=(16.0, 512.0)))
    started = replace(cfg, train=replace(cfg.train, probe=ProbeConfig(scale=64.0, learn_scale=True)))
    assert _config_key(cfg, "abc") == _config_key(wide, "abc") == _config_key(started, "abc")
    cos = replace(cfg, train=replace(cfg.train, probe=ProbeConfig(head="cosine")))
    cos_wide = replace(cos, train=replace(cos.train, scale=(16.0, 512.0)))
    assert len({_config_key(cfg, "abc"), _config_key(cos, "abc"), _config_key(cos_wide, "abc")}) == 3


def test_summary_has_easy_deltas_hard_cis_and_counts_of_clear_runs(tmp_path: Path) -> None:
    """summary.md: ΔEasy and the ΔHard bootstrap CI per run; per method the mean Δs and how many runs have a
    ΔHard CI above / below 0 (one run: mr2 lifts the hard classes by 40 points, mr2_uniform lowers them)."""
    import numpy as np

    from mr2probe.bench import CellResult, Suite, write_summary
    from mr2probe.report import report_run

    acc = {"ce": [0.9, 0.3, 0.8, 0.4, 1.0, 0.6], "mr2": [0.9, 0.7, 0.8, 0.8, 1.0, 0.6],
           "mr2_uniform": [0.9, 0.1, 0.8, 0.2, 1.0, 0.6]}  # hard = classes 1 and 3 (CE's two lowest)
    n, k = 100, len(acc["ce"])
    y = np.repeat(np.arange(k), n)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    runs, preds = [], {"test_labels": y}
    for method, a in acc.items():
        right = np.concatenate([np.arange(n) < round(p * n) for p in a])
        preds[f"{method}/0"] = np.where(right, y, (y + 1) % k)
        runs.append({"method": method, "seed": 0, "hparams": {}, "per_class_acc": a, "val_per_class_acc": a})
    (run_dir / "results.json").write_text(json.dumps({
        "class_names": [f"c{i}" for i in range(k)], "test_class_counts": [n] * k, "reference": "ce",
        "head": "linear", "adapter": "none", "provenance": {"encoder": "e", "dataset": "d"}, "runs": runs}))
    np.savez(run_dir / "predictions.npz", **{key.replace("/", "__"): v for key, v in preds.items()})
    summary = report_run(run_dir).summary
    suite = Suite(path=tmp_path / "t.toml", datasets=["d"], encoders=[], methods=list(acc), heads=["linear"], seeds=[0])
    text = write_summary(suite, [CellResult("d", "e", "linear", "done", "", run_dir, summary)], tmp_path).read_text()
    row = next(r for r in md_rows(text, "run") if r["method"] == "mr2")
    assert (row["dataset"], row["encoder"]) == ("d", "e") and {"ΔEasy", "ΔHard 95% CI"} <= set(row)
    lo, hi = map(float, re.fullmatch(r"\[(-?[\d.]+), (-?[\d.]+)\]", row["ΔHard 95% CI"]).groups())
    assert row["ΔHard"] == "**+40.00**" and 0 < lo < 40 < hi, row  # one seed: no sample SD
    avg = {r["method"]: r for r in md_rows(text, "method")}
    cols = ["runs", "ΔHard", "ΔEasy", "ΔAll"]  # then the other Δs and the counts of runs by their CIs
    assert [avg["mr2"][c] for c in cols] == ["1", "**+40.00**", "**0.00**", "**+13.33**"]
    assert [avg["mr2_uniform"][c] for c in cols] == ["1", "-20.00", "**0.00**", "-6.67"]


def named_suite(tmp_path: Path, feats: Path) -> Path:
    """Two named runs on a copy of the bundled features (linear; cosine with its own settings merged over the
    suite's), one on a derived synthetic file, one whose feature file is missing, and a comparison."""
    path = tmp_path / "named.toml"
    path.write_text(f"""
methods = ["ce", "mr2"]
seeds = 1

[train]
epochs = 1
min_steps = 5
set = {{ mr2 = {{ p = 2 }} }}

[[runs]]
name = "lin"
features = "{feats}"

[[runs]]
name = "cos"
features = "{feats}"
head = "cosine"
profile = "shots:20"
train = {{ scale = 16, episodes = 2, null = false, set = {{ mr2 = {{ exponent = 1 }} }} }}

[[runs]]
name = "synth"
features = "synthetic:K=4,D=8,n=30,seed=0"
methods = ["ce"]

[[runs]]
name = "gone"
features = "{tmp_path / 'no-such.h5'}"

[[compare]]
name = "cos-vs-lin"
runs = ["lin", "cos"]
""")
    return path


@pytest.mark.slow
def test_named_runs_compare_and_report_only(tmp_path: Path) -> None:
    """[[runs]] trained end to end into OUT/<name>/ with their merged settings, a missing feature file skipped with
    one line, the [[compare]] written like `report A B --summary`, then --report-only re-renders from results.json
    alone (features deleted) without writing report.html, heads or parts."""
    import shutil

    feats = tmp_path / "small.h5"
    shutil.copy(BUNDLED, feats)
    suite, out, fdir = named_suite(tmp_path, feats), tmp_path / "out", tmp_path / "features"
    r = run_cli("bench", str(suite), "--features-dir", str(fdir), "--out", str(out), "-q")
    assert r.returncode == 0, r.stderr
    skips = [line for line in r.stderr.splitlines() if line.startswith("skip ")]
    assert len(skips) == 1 and "run(s) gone: missing features: no file" in skips[0], r.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "cos", "cos-vs-lin.csv", "cos-vs-lin.md", "cos-vs-lin.png", "lin", "summary.csv", "summary.md",
        "summary.png", "synth"]
    lin, cos = (json.loads((out / n / "results.json").read_text()) for n in ("lin", "cos"))
    assert lin["config"]["train"]["min_steps"] == 5 and lin["config"]["train"]["method_params"] == {"mr2": {"p": 2}}
    assert lin["head"] == "linear" and lin["profile"]["kind"] == "full" and lin["config"]["null"] is True
    assert cos["head"] == "cosine" and cos["config"]["train"]["scale"] == [16.0] and cos["config"]["null"] is False
    assert cos["config"]["train"]["method_params"] == {"mr2": {"p": 2, "exponent": 1}}  # merged method by method
    assert (cos["profile"]["text"], cos["profile"]["episodes"]) == ("shots:20", 2)
    synth = json.loads((out / "synth" / "results.json").read_text())
    assert [p.parent for p in fdir.glob("*.h5")] == [fdir] and synth["config"]["methods"] == ["ce"]
    compare = (out / "cos-vs-lin.md").read_text()
    assert "`lin`" in compare and "`cos`" in compare and "`synth`" not in compare
    summary = (out / "summary.md").read_text()
    assert {row["run"] for row in md_rows(summary, "run")} == {"[lin](lin/table.md)", "[cos](cos/table.md)",
                                                                 "[synth](synth/table.md)"}
    assert "- gone: missing features" in summary

    # --report-only on folders as git holds them (no parts/, no heads) without the feature files: every table, plot
    # and comparison is written again, nothing else
    feats.unlink()
    shutil.rmtree(fdir)
    for name in ("lin", "cos", "synth"):
        shutil.rmtree(out / name / "parts")
        (out / name / "heads.safetensors").unlink()
    made = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.suffix in (".json", ".npz")}
    rendered = [out / "lin" / "table.md", out / "cos" / "per_class.png", out / "cos-vs-lin.md", out / "cos-vs-lin.png",
                out / "summary.md"]
    for p in rendered:
        p.unlink()
    r = run_cli("bench", str(suite), "--out", str(out), "--report-only", "-q")
    assert r.returncode == 0, r.stderr
    assert all(p.is_file() for p in rendered)
    assert (out / "cos-vs-lin.md").read_text() == compare
    for unwanted in ("report.html", "parts", "heads.safetensors"):
        assert not list(out.rglob(unwanted)), unwanted
    kept = {p: t for p, t in made.items() if p.name != "summary.json"}
    assert all(p.stat().st_mtime_ns == t for p, t in kept.items())  # results.json and predictions untouched
    assert "skip gone: --report-only and no" in r.stderr


@pytest.mark.parametrize("body, message", [
    ('[[runs]]\nname = "a"\nfeatures = "f.h5"\nheads = ["linear"]', "[[runs]] 'a': unknown key(s) heads"),
    ('[[runs]]\nname = "a"\nfeatures = "f.h5"\ntrain = { epoch = 1 }', "'a' train: unknown key(s) epoch"),
    ('[[runs]]\nname = "a"\nfeatures = "f.h5"\n[[runs]]\nname = "a"\nfeatures = "g.h5"',
     "two runs are named 'a'"),
    ('[[runs]]\nname = "a"\nfeatures = "f.h5"\n[[compare]]\nname = "c"\nruns = ["a", "b"]',
     "[[compare]] 'c': no run named b"),
    ('[[runs]]\nname = "a"\nfeatures = "f.h5"\n[[compare]]\nname = "c"\nruns = ["a"]\nextra = 1',
     "[[compare]] 'c': unknown key(s) extra"),
    ('[[runs]]\nname = "a"\nfeatures = "f.h5"\ndataset = "mnist"', "give either features"),
    ('[[runs]]\nname = "a/b"\nfeatures = "f.h5"', "name must be a plain folder name"),
    ('[[runs]]\nfeatures = "f.h5"', "has no name"),
    ('[[runs]]\nname = "a"\nfeatures = "f.h5"\nmethods = ["ce"]\ntrain = { set = { mr2 = { p = 2 } } }',
     "'a': --set names mr2, which is not in --methods"),
    ('[train]\nset = { mr3 = { p = 2 } }\n[[runs]]\nname = "a"\nfeatures = "f.h5"',
     "[train]: set names mr3, which no run of the suite trains"),
    ('datasets = ["mnist"]\nencoders = ["efficientnet-lite0"]\n[[runs]]\nname = "mnist-efficientnet-lite0-linear"\n'
     'features = "f.h5"', "two runs are named 'mnist-efficientnet-lite0-linear'"),
    ('datasets = ["mnist"]\n[[runs]]\nname = "a"\nfeatures = "f.h5"', "has no 'encoders' list"),
])
def test_bad_named_runs_are_refused(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(body + "\n")
    with pytest.raises(UserError, match=re.escape(message)):
        load_suite(path)


def test_bad_suite_is_one_error_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[[runs]]\nname = "a"\nfeatures = "f.h5"\n[[runs]]\nname = "a"\nfeatures = "g.h5"\n')
    r = run_cli("bench", str(path), "--out", str(tmp_path / "out"))
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: suite ") and "named 'a'" in lines[0]
    assert not (tmp_path / "out").exists()
