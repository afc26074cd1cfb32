"""The settings tables (mr2probe.settings.TRAIN and REPORT) against everything that takes a setting, in both
directions: every CLI flag of `train` and `report` that is a setting comes from a table (no flag declared by hand
beside them), every suite key is a table's, every estimator parameter a training setting or one of the estimators'
own arguments, and every training setting reaches the ExperimentConfig under one known field."""
from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
from typer.main import get_command

import mr2probe
from mr2probe.cli import app
from mr2probe.errors import UserError
from mr2probe.probes import SELECT
from mr2probe.runconfig import TRAIN_CONFIG_SETTINGS, ExperimentConfig, config_from_settings
from mr2probe.settings import NO_ESTIMATOR, REPORT, TABLE, TRAIN, check_table, resolved, split_report
from mr2probe.trainer import TrainConfig

# the arguments of a command that are not settings: what to train on and where, and how the command shows things
TRAIN_OWN = {"features", "out", "methods", "head", "adapter", "seeds", "set_", "train_profile", "quiet", "wide",
             "config", "print_config", "test_features", "class_map"}
REPORT_OWN = {"run_dirs", "no_null", "summary", "html", "no_plots", "wide", "test_features", "class_map"}
ESTIMATOR_OWN = {"method", "head", "adapter", "seed", "method_params"}  # and a method's own hyperparameters
PROBE_SETTINGS = {"width", "learn_scale"}  # ProbeConfig's (scale: its first grid value)
EXPERIMENT_SETTINGS = {f.name for f in dataclasses.fields(ExperimentConfig)} & set(TRAIN) | {"episodes", "profile_seed"}


def params(command: str) -> dict[str, object]:
    """name → click parameter of a ``mr2probe`` command."""
    return {p.name: p for p in get_command(app).commands[command].params}


def test_every_train_flag_is_a_setting_of_the_tables_or_the_commands_own() -> None:
    got = params("train")
    assert set(got) - TRAIN_OWN == set(TABLE)
    for name, s in TABLE.items():
        assert got[name].opts == [s.flag] and s.help[:40] in got[name].help, name


def test_the_report_flags_are_the_report_settings() -> None:
    got = params("report")
    assert set(got) - REPORT_OWN == set(REPORT)
    for name, s in REPORT.items():
        assert got[name].default == s.default and s.help[:40] in got[name].help, name


def test_every_suite_key_is_a_setting_and_report_settings_stay_out_of_the_run_config() -> None:
    values = {n: (list(s.default) if s.kind == "floats" else s.default) for n, s in TABLE.items()
              if s.default is not None}
    assert set(check_table(values, "[train]")) == set(values)
    report, rest = split_report(check_table(values, "[train]"))
    assert report == {n: s.default for n, s in REPORT.items()} and not set(rest) & set(REPORT)
    assert not set(TRAIN) & set(REPORT)
    for name in REPORT:
        with pytest.raises(ValueError, match=f"not training settings: {name}"):
            resolved({name: REPORT[name].default})
    with pytest.raises(UserError, match="select must be one of acc, macc"):
        check_table({"select": "f1"}, "[train]")


def test_every_estimator_parameter_is_a_training_setting_or_its_own() -> None:
    for cls in (mr2probe.ProbeClassifier, mr2probe.MR2Classifier):
        names = set(inspect.signature(cls).parameters) - ESTIMATOR_OWN
        taken = {n for n, s in TRAIN.items() if s.estimator is not NO_ESTIMATOR}
        method_own = names - taken
        assert all(n not in TABLE for n in method_own), (cls.__name__, method_own)
        assert taken <= names


def test_every_training_setting_reaches_the_config_under_one_field(tmp_path: Path) -> None:
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    assert set(TRAIN) == set(TRAIN_CONFIG_SETTINGS) | PROBE_SETTINGS | EXPERIMENT_SETTINGS
    for name in TRAIN_CONFIG_SETTINGS:
        field = fields[name]  # the field has the setting's name
        assert field.default == TRAIN[name].default, name  # the field's default is the setting's
    cfg = config_from_settings(tmp_path / "f.h5", tmp_path / "run", ["ce"], [0])
    for name in TRAIN_CONFIG_SETTINGS:
        assert getattr(cfg.train, name) == TRAIN[name].default, name
    plain = ExperimentConfig(tmp_path / "f.h5", tmp_path / "run")
    for name in ("select", "val_fraction", "reference", "null", "max_memory"):
        assert getattr(plain, name) == TRAIN[name].default, name
    assert SELECT == TRAIN["select"].choices
