"""The run model (mr2probe.results): every committed results.json loads, each earlier layout through its shim,
and what is written reads back equal."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from mr2probe.errors import UserError
from mr2probe.jsonfile import grid_rows
from mr2probe.results import LEGACY_SCHEMA, LEGACY_TRAIN_NAMES, SCHEMA, Budget, RunRecord, RunResults

ROOT = Path(__file__).resolve().parents[1]
OLDEST = ROOT / "results" / "fmnist-dinov2s14" / "linear"  # before profiles, budget rules and the null control
NO_RULE = ROOT / "results" / "fmnist-effl0-adapter" / "shots20-linear-refscale"  # before budget_rule and search
CHECKPOINTS = ROOT / "results" / "fmnist-dinov2s14-500-settings" / "linear-longtail100-checkpoints"
WITH_SEARCH = ROOT / "results" / "positive-control" / "synthetic-k10-d64-spread1-3-sep5-full"  # search recorded


def committed() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "results/**/results.json"], cwd=ROOT, capture_output=True, text=True)
    return [ROOT / p for p in out.stdout.split()]


def raw(folder: Path) -> dict:
    return json.loads((folder / "results.json").read_text())


def renamed(train: dict) -> dict:
    """A file's config.train under the settings' names (lrs → lr, …), as the legacy shim reads it."""
    return {LEGACY_TRAIN_NAMES.get(k, k): v for k, v in train.items()}


def test_every_committed_results_file_loads_and_round_trips() -> None:
    files = committed()
    assert len(files) > 100
    for path in files:
        res = RunResults.from_disk(path)
        want = raw(path.parent).get("schema", LEGACY_SCHEMA)  # files written before the schema field read as /1
        assert res.schema == want and res.runs and res.reference in {r.method for r in res.runs}, path
        again = RunResults.from_dict(json.loads(json.dumps(res.to_dict())))
        assert again.schema == want and again == res, path
    assert {raw(p.parent).get("schema", LEGACY_SCHEMA) for p in files} <= {LEGACY_SCHEMA, SCHEMA}


def test_the_oldest_layout_reads_as_a_full_profile_with_episode_0_and_no_budget() -> None:
    d, res = raw(OLDEST), RunResults.from_disk(OLDEST)
    assert not {"profile", "budget", "episodes", "null_control", "train_class_counts"} & set(d)
    assert all("episode" not in r for r in d["runs"])
    assert res.profile["kind"] == "full" and res.profile["text"] == "full"
    assert res.budget is None and res.episodes is None and res.null_control is None
    assert res.train_class_counts is None and {r.episode for r in res.runs} == {0}
    assert res.provenance.get("features_content_sha256") is None  # absent stays absent: no claimed value
    assert res.config["train"]["search"] == "full" and res.config["train"]["budget_rule"] == "floor"
    assert "min_steps" not in res.config["train"]  # not in the file, not claimed to have had today's default


def test_a_config_before_budget_rules_reads_as_floor_and_full_search() -> None:
    d, res = raw(NO_RULE), RunResults.from_disk(NO_RULE)
    assert "budget_rule" not in d["config"]["train"] and "search" not in d["config"]["train"]
    assert res.config["train"]["budget_rule"] == "floor" and res.config["train"]["search"] == "full"
    assert {k: v for k, v in res.config["train"].items() if k not in ("budget_rule", "search")} == \
        renamed(d["config"]["train"])


def test_a_current_file_is_written_back_as_it_was_apart_from_the_schema() -> None:
    for folder in (WITH_SEARCH, CHECKPOINTS):
        d, res = raw(folder), RunResults.from_disk(folder)
        out = res.to_dict()
        assert out.pop("schema") == d.pop("schema", LEGACY_SCHEMA)
        d["config"]["train"] = {"search": "full", **renamed(d["config"]["train"])}  # written under the new names
        assert out == d, folder


def test_typed_fields_of_a_checkpoints_run() -> None:
    res = RunResults.from_disk(CHECKPOINTS)
    assert isinstance(res.budget, Budget) and res.budget.checkpoints and res.budget.floor_steps == \
        res.budget.checkpoints[0]
    ce = res.runs_of("ce")
    assert ce and all(r.checkpoint_step in res.budget.checkpoints for r in ce)
    assert all("checkpoint_step" in g for r in ce for g in r.grid)


def test_a_grid_written_as_rows_reads_as_the_column_layout(tmp_path: Path) -> None:
    d = raw(CHECKPOINTS)
    rows = {**d, "runs": [{**r, "grid": grid_rows(r["grid"])} for r in d["runs"]]}
    assert isinstance(rows["runs"][0]["grid"], list)
    (tmp_path / "results.json").write_text(json.dumps(rows))
    assert RunResults.from_disk(tmp_path) == RunResults.from_disk(CHECKPOINTS)


def test_method_records_are_kept_as_info() -> None:
    run = RunRecord.from_dict({"method": "mr2", "seed": 0, "per_class_acc": [0.5, 0.5], "margins": [1.0, 2.0],
                               "variability": [0.1, 0.2], "s_bar": 3.0})
    assert run.margins == [1.0, 2.0] and run.variability == [0.1, 0.2] and run.info["s_bar"] == 3.0
    assert RunRecord.from_dict(run.to_dict()) == run and run.key == "mr2/0" and run.episode == 0


def test_a_new_file_has_the_schema(tmp_path: Path) -> None:
    res = RunResults.from_disk(WITH_SEARCH)
    res.schema = SCHEMA
    res.write(tmp_path / "results.json")
    assert json.loads((tmp_path / "results.json").read_text())["schema"] == SCHEMA
    assert RunResults.from_disk(tmp_path) == res and res.numbers() == RunResults.from_disk(WITH_SEARCH).numbers()


@pytest.mark.parametrize("text, message", [
    (None, "not found"), ("{", "is not valid JSON"), ('{"runs": []}', "holds no runs"),
    ('{"runs": [{"method": "ce", "seed": 0, "per_class_acc": [1]}]}', "missing field 'class_names'"),
    ('{"runs": [{"method": "ce", "seed": 0, "per_class_acc": [1]}], "class_names": ["a", "b"], '
     '"test_class_counts": [1, 1]}', "malformed per_class_acc")])
def test_a_bad_file_is_one_user_error(tmp_path: Path, text: str | None, message: str) -> None:
    if text is not None:
        (tmp_path / "results.json").write_text(text)
    with pytest.raises(UserError, match=message):
        RunResults.from_disk(tmp_path)
