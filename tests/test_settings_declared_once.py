"""No setting is renamed or re-declared below the settings tables (mr2probe.settings: TRAIN, REPORT, EXTRACT).

Every surface that takes a setting is walked against the tables: the `train`, `report` and `extract` flags (the
click commands' parameters), the keys of a suite's [train] and [extract] tables and of a recipe, the estimators'
parameters, and the fields of TrainConfig, ExperimentConfig and ExtractConfig. Each name there is a declared
setting under the same name (with the setting's flag and default), or one of a short list of arguments that are
no setting, each with the reason; and each config's check refuses what its settings declare out of range."""
from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
from typer.main import get_command

import mr2probe
from mr2probe.bench import EXTRACT_KEYS, load_suite
from mr2probe.cli import app
from mr2probe.encoders.readout import POOLS
from mr2probe.errors import UserError
from mr2probe.extract import AMP_DTYPES, ExtractConfig, _check_config
from mr2probe.heads import ProbeConfig
from mr2probe.methods import METHODS
from mr2probe.recipes import SETTINGS as RECIPE_KEYS
from mr2probe.runconfig import ExperimentConfig
from mr2probe.settings import EXTRACT, NO_ESTIMATOR, READOUT, REPORT, TABLE, TRAIN, Setting, check_table
from mr2probe.trainer import TrainConfig

# The arguments of each surface that are no setting, and why.
TRAIN_OWN = {"features", "out", "methods", "seeds",  # what to train on, which methods and seeds, where to write
             "head", "adapter", "train_profile",  # the probe and the training set: the run's cell, not a knob
             "set_",  # a method's own hyperparameters (METHOD.PARAM=VALUE), declared by the method
             "quiet", "wide", "test_features", "class_map",  # how the run is shown and what is scored afterwards
             "config", "print_config"}  # a file of these settings, and printing it
REPORT_OWN = {"run_dirs", "no_null", "summary", "html", "no_plots", "wide", "test_features", "class_map"}
EXTRACT_OWN = {"encoder", "dataset", "out", "recipe", "root", "download", "weights",  # what to extract, from where
               "splits", "overwrite", "quiet"}  # which splits, start over, progress bars
ESTIMATOR_OWN = {"method", "head", "adapter", "seed", "method_params"}  # and the method's own hyperparameters
TRAIN_CONFIG_OWN = {"probe",  # the head, adapter, width and learn_scale (ProbeConfig, built from settings)
                    "method_params",  # --set: the methods' own hyperparameters
                    "progress",  # progress bars (--quiet)
                    "chunk_mib"}  # how the CPU groups heads (the same heads): an engine detail, no flag
EXPERIMENT_OWN = {"features", "out", "methods", "seeds", "train",  # the run's inputs and its TrainConfig
                  "val_seed",  # the seed of the stratified val hold-out: fixed at 0, no flag
                  "profile"}  # the training profile (--train-profile, with the episodes and profile_seed settings)
EXTRACT_CONFIG_OWN = {"encoder", "dataset", "out", "root", "download", "weights", "splits", "overwrite",
                      "progress", "checksum",  # fletcher32 on every dataset, always on (tests turn it off)
                      "say"}  # rank 0's one-line notes (a callable)
PROBE_FIELDS = {"width", "learn_scale"}  # the settings that reach the TrainConfig through ProbeConfig


def params(command: str) -> dict[str, Any]:
    """name → click parameter of a ``mr2probe`` command."""
    return {p.name: p for p in get_command(app).commands[command].params}


def fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def allowed_keys(message: str) -> set[str]:
    """The key list of an "unknown key(s) …; allowed: a, b, c" error."""
    return set(re.search(r"allowed: (.*)$", message).group(1).split(", "))


@pytest.mark.parametrize("command, table, own", [("train", TABLE, TRAIN_OWN), ("report", REPORT, REPORT_OWN),
                                                 ("extract", EXTRACT, EXTRACT_OWN)])
def test_every_flag_is_a_setting_under_its_name_or_the_commands_own(command: str, table: dict[str, Setting],
                                                                    own: set[str]) -> None:
    got = params(command)
    assert set(got) - own == set(table), command  # no setting missing, no flag declared beside the table
    for name, s in table.items():
        assert got[name].opts == [s.flag] and s.help[:40] in got[name].help, (command, name)


def test_every_suite_and_recipe_key_is_a_setting_under_its_name(tmp_path: Path) -> None:
    with pytest.raises(UserError) as train:
        check_table({"nope": 1}, "[train]", extra={"set": dict})
    assert allowed_keys(str(train.value)) == set(TABLE) | {"set"}
    suite = tmp_path / "s.toml"
    suite.write_text('datasets = ["mnist"]\nencoders = ["efficientnet-lite0"]\n[extract]\nnope = 1\n')
    with pytest.raises(UserError) as extract:
        load_suite(suite)
    assert allowed_keys(str(extract.value)) == set(EXTRACT) - set(READOUT)
    assert all(EXTRACT_KEYS[n] is EXTRACT[n] for n in EXTRACT_KEYS)  # the same Setting, not a copy
    assert set(RECIPE_KEYS) == {"encoder"} | set(EXTRACT)


def test_every_estimator_parameter_is_a_training_setting_its_own_or_a_methods() -> None:
    taken = {n for n, s in TRAIN.items() if s.estimator is not NO_ESTIMATOR}
    for cls in (mr2probe.ProbeClassifier, mr2probe.MR2Classifier):
        sig = inspect.signature(cls).parameters
        rest = set(sig) - ESTIMATOR_OWN - taken
        assert taken <= set(sig), cls.__name__
        assert all(sig[n].default == TRAIN[n].estimator for n in taken), cls.__name__
        assert rest <= set(METHODS.get("mr2").defaults) and not rest & set(TABLE), (cls.__name__, rest)


@pytest.mark.parametrize("cls, table, own", [(TrainConfig, TRAIN, TRAIN_CONFIG_OWN),
                                             (ExperimentConfig, TRAIN, EXPERIMENT_OWN),
                                             (ExtractConfig, EXTRACT, EXTRACT_CONFIG_OWN)])
def test_every_config_field_is_a_setting_under_its_name_with_its_default(cls: type, table: dict[str, Setting],
                                                                         own: set[str]) -> None:
    got = fields(cls)
    assert set(got) - own <= set(table), (cls.__name__, set(got) - own - set(table))
    for name in set(got) - own:
        assert default(got[name]) == table[name].default, (cls.__name__, name)


def test_every_setting_reaches_one_config_field() -> None:
    train = set(fields(TrainConfig)) - TRAIN_CONFIG_OWN
    experiment = set(fields(ExperimentConfig)) - EXPERIMENT_OWN
    assert not train & experiment and set(TRAIN) == train | experiment | PROBE_FIELDS | {"episodes", "profile_seed"}
    assert PROBE_FIELDS <= set(fields(ProbeConfig))
    assert set(EXTRACT) == set(fields(ExtractConfig)) - EXTRACT_CONFIG_OWN


def test_the_choices_are_those_the_engines_take() -> None:
    assert EXTRACT["amp"].choices == tuple(AMP_DTYPES) and EXTRACT["pool"].choices == POOLS


def outside(s: Setting) -> Any:
    """A value the setting declares out of range (None if it declares no range)."""
    if s.choices:
        return "not-a-choice"
    bad = (s.low - 1 if s.low is not None else s.high + 1) if (s.low, s.high) != (None, None) else None
    if bad is None:
        return (float("inf"),) if s.kind == "floats" else None
    return (bad,) if s.kind == "floats" else bad


def checked(table: dict[str, Setting], names: set[str]) -> list[tuple[str, Any]]:
    return [(n, outside(table[n])) for n in sorted(names) if outside(table[n]) is not None]


@pytest.mark.parametrize("name, bad", checked(TRAIN, set(fields(TrainConfig)) - TRAIN_CONFIG_OWN))
def test_train_config_check_refuses_what_the_setting_declares(name: str, bad: Any) -> None:
    with pytest.raises(UserError, match=f"^{re.escape(TRAIN[name].flag)} .*must be"):
        TrainConfig(**{name: bad}).check()
    TrainConfig().check()


@pytest.mark.parametrize("name, bad", checked(TRAIN, set(fields(ExperimentConfig)) - EXPERIMENT_OWN))
def test_experiment_config_check_refuses_what_the_setting_declares(name: str, bad: Any) -> None:
    with pytest.raises(UserError, match=f"^{re.escape(TRAIN[name].flag)} .*must be"):
        ExperimentConfig(Path("f.h5"), Path("o"), **{name: bad}).check()


@pytest.mark.parametrize("name, bad", checked(EXTRACT, set(EXTRACT) - set(READOUT)))
def test_extract_config_check_refuses_what_the_setting_declares(name: str, bad: Any) -> None:
    with pytest.raises(UserError, match=f"^{re.escape(EXTRACT[name].flag)} .*must be"):
        _check_config(ExtractConfig("e", "d", Path("o.h5"), **{name: bad}))


def test_one_message_per_declared_rule() -> None:
    with pytest.raises(UserError, match=r"^--lr values must be finite and > 0, got \[0.001, inf\]$"):
        TRAIN["lr"].check((1e-3, float("inf")), "--lr")
    with pytest.raises(UserError, match=r"^--val-fraction must be in \(0, 1\), got 1$"):
        TRAIN["val_fraction"].check(1.0, "--val-fraction")
    with pytest.raises(UserError, match=r"^--wd values must be finite and ≥ 0, got \[\]$"):
        TRAIN["wd"].check((), "--wd")
    with pytest.raises(UserError, match=r"^suite x \[train\]: epochs must be ≥ 1, got 0$"):
        check_table({"epochs": 0}, "suite x [train]")
    assert TRAIN["wd"].check((0.0, 0.1), "--wd") == (0.0, 0.1) and EXTRACT["pool"].check(None, "--pool") is None
