"""The committed study: every folder of results/ is made by the suite benchmarks/study/<folder>.toml.

`mr2probe bench benchmarks/study/<folder>.toml --out results/<folder>` must train exactly the committed run folders
with the settings their results.json recorded, and write every comparison file that is committed beside them.
Nothing is trained here: the suites are loaded and their resolved settings compared with results.json."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT
from mr2probe.bench import RunEntry, Suite, entry_config, features_path, load_suite
from mr2probe.results import RunResults

STUDY = ROOT / "benchmarks" / "study"
RESULTS = ROOT / "results"
SUITES = sorted(STUDY.glob("*.toml"))
FOLDERS = sorted(p for p in RESULTS.iterdir() if p.is_dir() and list(p.glob("*/results.json")))  # folders of runs
RUNS = sorted(RESULTS.glob("*/*/results.json"))
FULL = {"kind": "full", "value": None, "episodes": 1, "seed": 0}


def suite_of(folder: str) -> Suite:
    return load_suite(STUDY / f"{folder}.toml")


def entries_of(folder: str) -> dict[str, RunEntry]:
    return {e.name: e for e in suite_of(folder).entries()}


def plain(value: Any) -> Any:
    """As results.json holds it (tuples as lists)."""
    return json.loads(json.dumps(value, default=str))


@pytest.mark.parametrize("path", SUITES, ids=lambda p: p.stem)
def test_every_study_suite_loads(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # recipe paths are relative to the repository root
    suite = load_suite(path)
    assert suite.entries(), path
    text = path.read_text()
    assert text.startswith("# results/") and f"mr2probe bench benchmarks/study/{path.name}" in text


def test_one_suite_per_results_folder_and_no_scripts_left() -> None:
    assert {p.stem for p in SUITES} == {p.name for p in FOLDERS}
    assert not list(RESULTS.glob("*.sh")) and not list(RESULTS.glob("*/run.sh"))


@pytest.mark.parametrize("folder", [p.name for p in FOLDERS])
def test_suite_runs_are_the_committed_run_folders(folder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    committed = {p.parent.name for p in (RESULTS / folder).glob("*/results.json")}
    assert set(entries_of(folder)) == committed


def recorded_settings(results: dict[str, Any]) -> dict[str, Any]:
    """The settings that decide a run's numbers, as its results.json recorded them (fields that did not exist
    when it was trained take the behaviour of that version: no null control, no step floor, one fixed scale)."""
    config = RunResults.from_dict(results).config  # config.train under the settings' names, whatever the file's
    train = config["train"]
    probe = train["probe"]
    cosine = probe["head"] == "cosine"
    rule = train.get("budget_rule") or "floor"
    return {
        "methods": config["methods"], "seeds": config["seeds"], "null": config.get("null", False),
        "reference": results["reference"], "select": config["select"], "val_fraction": config["val_fraction"],
        "val_seed": config["val_seed"], "epochs": train["epochs"], "batch_size": train["batch_size"],
        "lr": train["lr"], "wd": train["wd"], "l2": train.get("l2", [0.0]),
        "min_steps": train.get("min_steps", 0), "budget_rule": rule,
        "max_steps": train.get("max_steps") if rule != "floor" else None,
        "method_params": train["method_params"], "method_grid": train["method_grid"],
        "head": probe["head"], "adapter": probe["adapter"], "width": probe["width"],
        "learn_scale": probe["learn_scale"],
        "scale": train.get("scale", [probe["scale"]]) if cosine else None,
        "probe_scale": probe["scale"] if cosine else None,
        "profile": {k: v for k, v in (results.get("profile") or FULL).items() if k in FULL},
        "head_field": results["head"], "adapter_field": results["adapter"],
    }


def suite_settings(entry: RunEntry) -> dict[str, Any]:
    """The same settings from the suite entry's resolved ``ExperimentConfig``."""
    cfg = entry_config(entry, Path("features.h5"), Path("out"), progress=False)
    t, probe = cfg.train, cfg.train.probe
    cosine = probe.head == "cosine"
    return plain({
        "methods": cfg.methods, "seeds": cfg.seeds, "null": cfg.null, "reference": cfg.reference_method,
        "select": cfg.select, "val_fraction": cfg.val_fraction, "val_seed": cfg.val_seed, "epochs": t.epochs,
        "batch_size": t.batch_size, "lr": t.lr, "wd": t.wd, "l2": t.l2,
        "min_steps": t.min_steps, "budget_rule": t.budget_rule,
        "max_steps": t.max_steps if t.budget_rule != "floor" else None, "method_params": t.method_params,
        "method_grid": t.method_grid, "head": probe.head, "adapter": probe.adapter, "width": probe.width,
        "learn_scale": probe.learn_scale, "scale": t.scale if cosine else None,
        "probe_scale": probe.scale if cosine else None,
        "profile": {k: v for k, v in cfg.profile.as_dict().items() if k in FULL},
        "head_field": probe.head, "adapter_field": probe.adapter,
    })


@pytest.mark.parametrize("path", RUNS, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_suite_entry_has_the_recorded_settings(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    folder, name = path.parent.parent.name, path.parent.name
    suite = suite_of(folder)
    entry = {e.name: e for e in suite.entries()}.get(name)
    assert entry is not None, f"benchmarks/study/{folder}.toml has no run {name!r}"
    results = json.loads(path.read_text())
    assert suite_settings(entry) == recorded_settings(results)
    if entry.derived:
        return  # a synthetic: / spread: file, named by materialize() after its spec
    expected = (features_path(suite, entry.dataset, entry.encoder, Path("features")) if entry.encoder is not None
                else Path(entry.features))
    assert Path(results["provenance"]["features"]) == expected  # the same feature file the run was trained on


@pytest.mark.parametrize("folder", [p.name for p in FOLDERS])
def test_every_comparison_is_committed_and_every_committed_one_is_in_the_suite(folder: str,
                                                                                monkeypatch: pytest.MonkeyPatch
                                                                                ) -> None:
    monkeypatch.chdir(ROOT)
    suite = suite_of(folder)
    for c in suite.compares:
        for ext in ("md", "csv", "png"):
            assert (RESULTS / folder / f"{c.name}.{ext}").is_file(), f"results/{folder}/{c.name}.{ext}"
        text = (RESULTS / folder / f"{c.name}.md").read_text()
        assert all(f"`{run}`" in text for run in c.runs)  # the runs it compares, by name
    committed = {p.stem for p in (RESULTS / folder).glob("*.md")} - {"summary", "sensitivity"}  # sensitivity.py
    assert committed == {c.name for c in suite.compares}


def test_the_tracked_study_is_light() -> None:
    """What git tracks of results/: ≤ 40 MB in all, no file over 2 MB, no plot over 300 KB, no heads, parts,
    report.html, table.tex, summary.json or a run folder's plots (outputs that the kept results.json /
    predictions.npz / table.csv render again)."""
    git = subprocess.run(["git", "ls-files", "-z", "results"], cwd=ROOT, capture_output=True)
    if git.returncode != 0 or not git.stdout:
        pytest.skip("not a git checkout")
    tracked = [Path(p) for p in git.stdout.decode().split("\0") if p]  # relative to the repository root
    sizes = {p: (ROOT / p).stat().st_size for p in tracked if (ROOT / p).exists()}
    assert sum(sizes.values()) <= 40_000_000
    assert max(sizes.values()) <= 2_000_000
    assert max(s for p, s in sizes.items() if p.suffix == ".png") <= 300_000
    outputs = {"heads.safetensors", "report.html", "table.tex", "summary.json", "tradeoff.png", "variability.png",
               "per_class.png", "groups.png"}
    assert not [p for p in tracked if p.name in outputs or "parts" in p.parts]
