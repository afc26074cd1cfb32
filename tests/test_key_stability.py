"""Part keys and committed results across the rename of TrainConfig's fields to the settings' names (lrs → lr,
weight_decays → wd, l2s → l2, scales → scale, use_method_grids → method_grid): a resumed run finds the parts it
finished before, a committed results.json (written under the earlier names) loads under the new ones, and a
command of the committed study still recognises its run folder as finished."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from conftest import ROOT
from mr2probe.bench import entry_config, load_suite
from mr2probe.results import LEGACY_TRAIN_NAMES, RunResults
from mr2probe.runconfig import config_from_settings
from mr2probe.runstore import KEY_NAMES, _config_key, config_record, results_identity, run_identity
from mr2probe.settings import TRAIN
from mr2probe.trainer import TrainConfig

CONTENT = "0123456789abcdef" * 4  # a feature file's content hash
STREAM = {"block_rows": 64, "piece_rows": 8}
OLD_NAMES = ROOT / "results" / "fmnist-effl0-protocol" / "linear"  # config.train as lrs, weight_decays, …
STUDY = "fmnist-effl0-adapter"  # committed runs written under the earlier names


def configs() -> dict[str, object]:
    f, o = Path("f.h5"), Path("o")
    return {
        "linear-defaults": config_from_settings(f, o, ["ce", "mr2"], [0, 1, 2]),
        "cosine-grids": config_from_settings(
            f, o, ["ce", "mr2", "ldam"], [0, 1], head="cosine", adapter="linear",
            values={"lr": (1e-3, 3e-2), "wd": (0.0,), "scale": (16.0, 64.0), "method_grid": False,
                    "search": "halving", "budget_rule": "checkpoints", "max_steps": 4000},
            method_params={"mr2": {"lam": 0.1}}, profile="shots:5"),
        "linear-l2": config_from_settings(f, o, ["ce"], [0], values={"l2": (0.0, 1e-4), "wd": (0.0,)}),
    }


# These keys were printed by runstore._config_key on the commit before the rename (fields lrs, weight_decays, l2s,
# scales, use_method_grids). They pin key stability across the rename: a part file is named by its key, so a
# changed key would make every resumed run train its finished seeds again. (in memory, streamed)
PINNED = {"linear-defaults": ("83e855d22afdb112", "e1c5d16bea3d797a"),
          "cosine-grids": ("d28033d9eba4b266", "572feae5c3178d8f"),
          "linear-l2": ("c983fa96b5be773e", "2a4a128d3ec5d8b7")}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_part_keys_are_those_of_before_the_rename(name: str) -> None:
    cfg = configs()[name]
    assert (_config_key(cfg, CONTENT), _config_key(cfg, CONTENT, STREAM)) == PINNED[name]


def test_the_key_names_are_the_fields_earlier_names_of_renamed_settings() -> None:
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert set(KEY_NAMES) <= fields & set(TRAIN)  # every renamed field is now a setting's name
    assert not set(KEY_NAMES.values()) & fields  # no earlier name is a field any more
    assert KEY_NAMES == {new: old for old, new in LEGACY_TRAIN_NAMES.items()}


def test_a_results_file_with_the_earlier_names_loads_under_the_settings_names() -> None:
    raw = json.loads((OLD_NAMES / "results.json").read_text())["config"]["train"]
    assert set(LEGACY_TRAIN_NAMES) <= set(raw)  # the committed file holds the earlier names
    res = RunResults.from_disk(OLD_NAMES)
    train = res.config["train"]
    assert not set(LEGACY_TRAIN_NAMES) & set(train)
    for old, new in LEGACY_TRAIN_NAMES.items():
        assert train[new] == raw[old], new
    written = res.to_dict()["config"]["train"]  # what a new results.json holds: the settings' names
    assert {"lr", "wd", "l2", "scale", "method_grid"} <= set(written) and not set(LEGACY_TRAIN_NAMES) & set(written)
    assert RunResults.from_dict(json.loads(json.dumps(res.to_dict()))) == res


def test_the_committed_study_runs_are_still_finished_for_their_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    """The identity of each run folder's results.json (earlier names) equals that of the suite's command now (the
    settings' names), so `bench` keeps the committed folder instead of training it again."""
    monkeypatch.chdir(ROOT)
    entries = load_suite(ROOT / "benchmarks" / "study" / f"{STUDY}.toml").entries()
    assert entries
    for entry in entries:
        folder = ROOT / "results" / STUDY / entry.name
        assert "lrs" in json.loads((folder / "results.json").read_text())["config"]["train"]
        res = RunResults.from_disk(folder)
        cfg = entry_config(entry, Path(res.provenance["features"]), folder, progress=False)
        mine = run_identity(config_record(cfg), res.profile, cfg.reference_method,
                            res.provenance.get("features_content_sha256"), None)
        assert mine == results_identity(res), entry.name
