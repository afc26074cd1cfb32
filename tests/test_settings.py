"""Each training setting is declared once (mr2probe.settings.TRAIN) and drives the CLI flag, the suite key and the
estimator parameter: same name, same default, and the same ExperimentConfig from the CLI and from a suite."""
from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from typer.main import get_command
from typer.testing import CliRunner

import mr2probe
import mr2probe.experiment as experiment
from mr2probe.bench import experiment_config, load_suite
from mr2probe.cli import app
from mr2probe.errors import UserError
from mr2probe.settings import NO_ESTIMATOR, TRAIN, check_table


def train_options() -> dict[str, object]:
    """flag → click parameter of `mr2probe train`."""
    cmd = get_command(app).commands["train"]
    return {opt: p for p in cmd.params for opt in p.opts}


def test_every_setting_is_a_train_flag_with_its_default() -> None:
    opts = train_options()
    for s in TRAIN.values():
        assert s.flag in opts, s.name
        p = opts[s.flag]
        assert p.name == s.name and s.help[:40] in p.help
        if s.kind == "bool":
            assert p.default is False  # a flag: --no-null turns the default-on setting off
        elif s.kind == "floats":
            assert tuple(float(v) for v in p.default.split(",")) == s.default
        else:
            assert p.default == s.default


def test_every_setting_is_a_suite_key_and_nothing_else_is() -> None:
    values = {n: (list(s.default) if s.kind == "floats" else s.default) for n, s in TRAIN.items()
              if s.default is not None}
    assert set(check_table(values, "[train]")) == set(values)
    with pytest.raises(UserError, match=r"unknown key\(s\) weight_decay; allowed: .*min_steps"):
        check_table({"weight_decay": [0.1]}, "[train]")
    with pytest.raises(UserError, match="lr must be a number or a list of numbers"):
        check_table({"lr": "fast"}, "[train]")


def test_estimator_parameters_are_the_settings_they_take() -> None:
    for cls in (mr2probe.ProbeClassifier, mr2probe.MR2Classifier):
        params = inspect.signature(cls).parameters
        for name, s in TRAIN.items():
            if s.estimator is NO_ESTIMATOR:
                assert name not in params, (cls.__name__, name)
            else:
                assert params[name].default == s.estimator, (cls.__name__, name)
        assert {"method", "head", "adapter", "seed", "method_params"} <= set(params)
    assert mr2probe.MR2Classifier().get_params()["c_bar"] == 1.0
    with pytest.raises(TypeError, match="weight_decay"):
        mr2probe.ProbeClassifier(weight_decay=0.1)


def test_cli_and_suite_build_the_same_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same values given as `train` flags and as a suite's [train] table → equal ExperimentConfigs."""
    seen = []

    class Stop(Exception):
        pass

    def capture(cfg, on_epoch=None):
        seen.append(cfg)
        raise Stop

    monkeypatch.setattr(experiment, "run_experiment", capture)
    feats, out = tmp_path / "f.h5", tmp_path / "out"
    r = CliRunner().invoke(app, ["train", "--features", str(feats), "--out", str(out), "--methods", "ce,mr2",
                                 "--seeds", "2", "--head", "cosine", "--epochs", "7", "--min-steps", "50",
                                 "--lr", "0.01,0.1", "--scale", "16", "--no-null", "--no-method-grid",
                                 "--set", "mr2.p=2", "--train-profile", "shots:5", "--episodes", "3",
                                 "--max-memory", "1GiB", "--reference", "mr2"])
    assert isinstance(r.exception, Stop), r.output
    suite = tmp_path / "s.toml"
    suite.write_text('datasets = ["fashion-mnist"]\nencoders = ["efficientnet-lite0"]\nmethods = ["ce", "mr2"]\n'
                     'seeds = 2\nheads = ["cosine"]\nprofiles = ["shots:5"]\n[train]\nepochs = 7\nmin_steps = 50\n'
                     'lr = [0.01, 0.1]\nscale = 16\nnull = false\nmethod_grid = false\nepisodes = 3\n'
                     'max_memory = "1GiB"\nreference = "mr2"\nset = { mr2 = { p = 2 } }\n')
    from_suite = experiment_config(load_suite(suite), "cosine", feats, out, profile="shots:5")
    assert seen[0] == from_suite
    assert from_suite.train.lr == (0.01, 0.1) and from_suite.null is False and from_suite.profile.episodes == 3


def test_a_bounded_setting_is_refused_in_a_suite_table_with_one_line() -> None:
    from mr2probe.errors import UserError
    from mr2probe.settings import check_table

    assert check_table({"equivalence_margin": 0.5}, "suite [train]") == {"equivalence_margin": 0.5}
    with pytest.raises(UserError, match=r"suite \[train\]: equivalence_margin must be > 0, got -1"):
        check_table({"equivalence_margin": -1}, "suite [train]")


def test_a_value_that_is_no_training_setting_is_refused_not_dropped(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not training settings: head"):
        experiment.config_from_settings(tmp_path / "f.h5", tmp_path / "run", ["ce"], [0], values={"head": "cosine"})
    cfg = experiment.config_from_settings(tmp_path / "f.h5", tmp_path / "run", ["ce"], [0], head="cosine",
                                          values={"epochs": 3})
    assert cfg.train.probe.head == "cosine" and cfg.train.epochs == 3
