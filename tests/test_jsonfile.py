"""results.json / summary.json text: outer levels one item per line, the rest compact; grids stored as columns."""
from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from mr2probe.jsonfile import grid_columns, grid_rows, json_text

RESULTS = {"class_names": ["a", "b"], "runs": [
    {"method": "ce", "seed": 0, "per_class_acc": [0.9346938775510204, 0.5], "hparams": {"lr": 0.001}},
    {"method": "mr2", "seed": 0, "per_class_acc": [1.0, 0.25], "hparams": {"lr": 0.01}}]}


def test_outer_levels_are_one_item_per_line_and_deeper_values_compact():
    text = json_text(RESULTS)
    assert json.loads(text) == RESULTS  # lossless without digits
    lines = text.splitlines()
    assert lines[0] == "{" and lines[-1] == "}"
    assert '   "per_class_acc": [0.9346938775510204,0.5],' in lines  # a run's field: one line, no spaces
    assert '   "hparams": {"lr":0.001}' in lines
    assert ' "class_names": ["a","b"],' in lines  # an array of plain values: one line
    assert len(lines) == 1 + 1 + 1 + 2 * (1 + 4 + 1) + 1 + 1  # {, names, "runs": [, 2 × ({, 4 fields, }), ], }


def test_digits_round_floats_only():
    text = json_text({"p": 0.012345678, "n": 7, "ci": [1.23456789, float("nan")], "s": "0.123456789"}, digits=3)
    back = json.loads(text)
    assert back["p"] == 0.0123 and back["n"] == 7 and back["ci"][0] == 1.23 and back["ci"][1] != back["ci"][1]
    assert back["s"] == "0.123456789"


def test_grid_as_columns_round_trips_and_is_smaller():
    rows = [{"hparams": {"lr": lr, "weight_decay": wd}, "val_score": 0.5 + lr, "checkpoint_step": 1000}
            for lr in (1e-3, 1e-2) for wd in (1e-4, 1e-2)]
    cols = grid_columns(rows)
    assert cols == {"hparams": {"lr": [1e-3, 1e-3, 1e-2, 1e-2], "weight_decay": [1e-4, 1e-2, 1e-4, 1e-2]},
                    "val_score": [0.501, 0.501, 0.51, 0.51], "checkpoint_step": [1000] * 4}
    assert grid_rows(cols) == rows and grid_rows(rows) == rows  # either layout reads back as rows
    assert len(json.dumps(cols)) < 0.7 * len(json.dumps(rows))
    assert grid_rows(None) == [] and grid_rows([]) == []


def test_points_with_different_keys_stay_rows():
    rows = [{"hparams": {"k": 10}, "val_score": 0.8}, {"hparams": {"k": 20, "p": 2}, "val_score": 0.7}]
    assert grid_columns(rows) is rows
    no_hparams = [{"hparams": {}, "val_score": 0.8}]
    assert grid_rows(grid_columns(no_hparams)) == no_hparams


@given(st.lists(st.tuples(st.floats(1e-6, 1.0), st.integers(1, 64), st.floats(0.0, 1.0)), min_size=1, max_size=12))
def test_any_uniform_grid_round_trips_through_json_text(points):
    rows = [{"hparams": {"lr": lr, "scale": s}, "val_score": v} for lr, s, v in points]
    assert grid_rows(json.loads(json_text({"grid": grid_columns(rows)}))["grid"]) == rows
