"""The reach-logreg budget rule (protocol.md: the reference must not be under-fit; a CE probe reaches the exact
L2 logistic regression within 0.5 point): min_steps doubled from the floor until the reference's val score is
within 0.5 point of logreg's, the same budget then for every method; recorded, resumable, bounded."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from conftest import run_cli, write_by_hand
from mr2probe.experiment import _keyed_train
from mr2probe.trainer import TrainConfig

# 400 training rows, batch 64: 7 steps per epoch, so the floor rule's budget is one epoch, 7 steps; lr 1e-2 is slow
# enough on these Gaussians that 7 steps leave ce far below logreg on val
SLOW = ["--seeds", "1", "--epochs", "1", "--min-steps", "1", "--batch-size", "64", "-q", "--lr", "1e-2", "--wd",
        "1e-4", "--methods", "ce,focal,logreg", "--budget-rule", "reach-logreg"]


@pytest.fixture
def feats(tmp_path: Path) -> Path:
    return write_by_hand(tmp_path / "f.h5", k=4, n_train=400, n_test=80, val=True)


@pytest.mark.slow
def test_reach_logreg_doubles_the_budget_until_the_reference_reaches_logreg_on_val(tmp_path: Path,
                                                                                    feats: Path) -> None:
    out = tmp_path / "run"
    args = ["train", "--features", str(feats), "--out", str(out), *SLOW]
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    res = json.loads((out / "results.json").read_text())
    cal = res["budget"]["calibration"]
    steps = [t["min_steps"] for t in cal["trials"]]
    assert steps == [7 * 2 ** i for i in range(len(steps))] and len(steps) >= 3  # from the floor, doubled
    target = cal["logreg_val"] - 0.005
    assert all(t["reference_val"] < target for t in cal["trials"][:-1]) and cal["trials"][-1]["reference_val"] >= target
    assert cal["reached"] is True and cal["min_steps"] == steps[-1] == res["budget"]["min_steps"]
    assert res["budget"]["steps"] == steps[-1]  # whole epochs of 7 steps
    runs = {x["method"]: x for x in res["runs"]}
    assert cal["logreg_val"] == runs["logreg"]["val_score"]
    # the calibration trains exactly the run's reference (same seed, grid and budget): the same val score
    assert runs["ce"]["val_score"] == cal["trials"][-1]["reference_val"]
    assert res["config"]["train"]["min_steps"] == 1 and res["config"]["train"]["budget_rule"] == "reach-logreg"
    assert f"{steps[-1]} steps by the reach-logreg rule, reached on val" in (out / "table.md").read_text()
    # resumed: the calibration and the seeds are kept (nothing trained, results.json as it was)
    before = (out / "results.json").read_bytes()
    again = run_cli(*args)
    assert again.returncode == 0 and "kept" in again.stdout and (out / "results.json").read_bytes() == before
    assert len(list((out / "parts").glob("budget-*.json"))) == 1


@pytest.mark.slow
def test_the_ceiling_stops_the_doubling_and_the_table_says_so(tmp_path: Path, feats: Path) -> None:
    out = tmp_path / "capped"
    r = run_cli("train", "--features", str(feats), "--out", str(out), *SLOW, "--max-steps", "28")
    assert r.returncode == 0, r.stderr
    res = json.loads((out / "results.json").read_text())
    cal = res["budget"]["calibration"]
    assert [t["min_steps"] for t in cal["trials"]] == [7, 14, 28] and cal["reached"] is False
    assert res["budget"]["steps"] == 28
    assert "not within 0.5 point at --max-steps 28" in " ".join(res["notes"])
    assert "its ceiling: not reached on val (raise --max-steps)" in (out / "table.md").read_text()


def test_the_floor_rule_keeps_the_part_keys_it_had() -> None:
    """Under the default rule the budget rule's settings are not part of the key (parts made before it are found);
    under reach-logreg they are."""
    assert not {"budget_rule", "max_steps"} & set(_keyed_train(asdict(TrainConfig())))
    assert {"budget_rule", "max_steps"} <= set(_keyed_train(asdict(TrainConfig(budget_rule="reach-logreg"))))


@pytest.mark.parametrize("args, message", [
    (["--budget-rule", "never"], "--budget-rule must be one of floor, reach-logreg, checkpoints"),
    (["--budget-rule", "reach-logreg", "--max-steps", "0"], "--max-steps must be ≥ 1"),
    (["--budget-rule", "reach-logreg", "--methods", "logreg,ce", "--reference", "logreg"], "is not trained in steps"),
])
def test_bad_budget_settings_are_one_line_errors(tmp_path: Path, feats: Path, args: list[str], message: str) -> None:
    out = tmp_path / "bad"
    r = run_cli("train", "--features", str(feats), "--out", str(out), "-q", *args)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not out.exists()
