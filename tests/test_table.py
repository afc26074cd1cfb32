"""The pandas view of results: long form per (run, method, seed, class) and the per-(run, method) summary, both
from the Summary the report renders."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import mr2probe
from mr2probe.summary import summarize as summarize_run

from test_report import ACC, write_results


def test_long_form_and_summary_agree_with_the_report(tmp_path: Path) -> None:
    a = write_results(tmp_path / "runs" / "linear")
    b = write_results(tmp_path / "runs" / "cosine", head="cosine")
    df = mr2probe.load_results([a, b])
    assert len(df) == 2 * sum(len(v) for v in ACC.values()) * 7  # runs × (method, seed) × classes
    assert set(df.columns) >= {"run", "dataset", "encoder", "head", "method", "seed", "class", "class_name",
                               "group", "test_acc", "val_acc", "hparams", "profile", "groups_on"}
    assert df[(df["run"] == "linear") & (df["group"] == "hard")]["class"].unique().tolist() == [1, 4]
    hard = df[df.group == "hard"].groupby(["head", "method", "seed"]).test_acc.mean().groupby(["head", "method"]).mean()
    s = mr2probe.summarize([a, b])
    ref = summarize_run(json.loads((a / "results.json").read_text()))
    row = s[(s["run"] == "linear") & (s["method"] == "mr2")].iloc[0]
    # points of % everywhere: the long form, summarize() and the tables
    assert row["Hard"] == pytest.approx(ref.mean["mr2"]["Hard"]) == pytest.approx(hard[("linear", "mr2")])
    assert df["test_acc"].max() == pytest.approx(100.0) and df["val_acc"].max() == pytest.approx(100.0)
    assert row["Hard_sd"] == pytest.approx(np.std([45.0, 50.0], ddof=1)) and row["seeds"] == 2
    assert bool(s[s["method"] == "ce"]["is_reference"].all()) and s.pivot(index="method", columns="head",
                                                                        values="ΔHard").shape == (3, 2)
