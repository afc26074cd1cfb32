"""``refit``: the grid point chosen on val trained again on train ∪ val (same epochs, so more steps; exact probes at
their chosen C / k) and scored on test, with the selection's hyperparameters, val scores and grid unchanged."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import write_by_hand
from mr2probe.errors import UserError
from mr2probe.experiment import run_experiment
from mr2probe.featurestore import read_features
from mr2probe.orchestrate import prepare_data
from mr2probe.probes import fit_logreg
from mr2probe.results import RunRecord, RunResults
from mr2probe.runconfig import config_from_settings
from mr2probe.runstore import _config_key
from mr2probe.selection import train_seed
from mr2probe.trainer import RunSpec, TrainData, train_stack

N_TRAIN, N_VAL = 80, 40
SETTINGS = {"epochs": 2, "min_steps": 0, "batch_size": 16, "lr": [0.01, 0.1], "wd": [1e-4], "null": False,
            "device": "cpu", "compile": "off"}


def config(path: Path, out: Path, refit: bool, methods: tuple[str, ...] = ("ce", "logreg", "knn")):
    return config_from_settings(path, out, list(methods), [0], values={**SETTINGS, "refit": refit},
                                progress=False)


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory):
    """One seed trained with and without the refit on a file with a val split (80 train, 40 val, 40 test rows)."""
    tmp = tmp_path_factory.mktemp("refit")
    path = write_by_hand(tmp / "f.h5", k=4, d=6, n_train=N_TRAIN, n_test=N_VAL, val=True, seed=5)
    cfg = config(path, tmp / "run", refit=True)
    data, test, _ = prepare_data(read_features(path), cfg, torch.device("cpu"))
    cache: dict = {}
    refit = train_seed(data, test, cfg, 0, lambda m: None, probe_cache=cache)
    plain = train_seed(data, test, replace(cfg, refit=False), 0, lambda m: None, probe_cache={})
    return data, test, cfg, cache, refit, plain


def test_refit_keeps_the_selection_and_trains_on_train_and_val(seeds) -> None:
    data, _, cfg, cache, (runs, _, heads), (plain_runs, _, plain_heads) = seeds
    plain = {r.method: r for r in plain_runs}
    for r in runs:
        p = plain[r.method]
        assert r.hparams == p.hparams and r.val_score == p.val_score and r.grid == p.grid
        assert r.val_per_class_acc == p.val_per_class_acc  # the groups are ranked on the selection runs' val
        assert r.refit["train_rows"] == N_TRAIN + N_VAL and p.refit is None
    ce = next(r for r in runs if r.method == "ce")
    assert (ce.refit["epochs"], ce.refit["steps"]) == (2, 2 * -(-(N_TRAIN + N_VAL) // 16))  # 2 epochs of 8 steps
    # the saved ce head is the chosen grid point trained by hand on the 120 rows of train ∪ val
    union = TrainData(torch.cat([data.x, data.val_x]), torch.cat([data.y, data.val_y]), data.val_x, data.val_y, 4)
    spec = RunSpec("ce", tuple(sorted(ce.hparams.items())), 0)
    by_hand = train_stack(union, [spec], cfg.train, epochs=2).probe.select([0])
    assert by_hand and all(torch.equal(heads[f"ce/0/{name}"], t) for name, t in by_hand.items())
    assert any(not torch.equal(plain_heads[f"ce/0/{name}"], t) for name, t in by_hand.items())  # not train's head


def test_exact_probes_are_refit_at_their_chosen_c_and_k(seeds) -> None:
    data, _, _, cache, (runs, preds, _), _ = seeds
    by = {r.method: r for r in runs}
    refit = {k[0]: v for k, v in cache.items() if k[-1] == "refit"}
    knn = refit["knn"]
    assert knn.model.x.shape[0] == N_TRAIN + N_VAL and knn.model.k == by["knn"].hparams["k"]
    logreg = refit["logreg"]
    assert logreg.hparams == {"C": by["logreg"].hparams["C"]} and len(logreg.grid) == 1
    union_x, union_y = torch.cat([data.x, data.val_x]), torch.cat([data.y, data.val_y])
    model = fit_logreg(union_x, union_y, 4, by["logreg"].hparams["C"])
    torch.testing.assert_close(logreg.model.weight, model.weight)
    assert np.array_equal(preds["logreg/0"], logreg.test_pred)


def test_refit_run_folder_records_it_and_keys_its_parts_apart(tmp_path: Path) -> None:
    path = write_by_hand(tmp_path / "f.h5", k=4, d=6, n_train=N_TRAIN, n_test=N_VAL, val=True, seed=5)
    cfg = config(path, tmp_path / "run", refit=True, methods=("ce", "knn"))
    results = RunResults.from_dict(run_experiment(cfg))
    assert results.config["refit"] is True and all(r.refit["train_rows"] == N_TRAIN + N_VAL for r in results.runs)
    assert any(n.startswith("refit: ") for n in results.notes)
    stored = json.loads((tmp_path / "run" / "results.json").read_text())
    assert all(r["refit"]["train_rows"] == N_TRAIN + N_VAL for r in stored["runs"])
    plain = replace(cfg, refit=False)
    assert _config_key(cfg, "h") != _config_key(plain, "h")
    assert "refit" not in json.dumps(RunRecord("ce", 0, [1.0]).to_dict())  # absent unless refit: old files alike
    assert RunRecord.from_dict({"method": "ce", "seed": 0, "per_class_acc": [1.0]}).refit is None


def test_refit_with_a_training_profile_is_refused(tmp_path: Path) -> None:
    cfg = config_from_settings(tmp_path / "f.h5", tmp_path / "run", ["ce"], [0], values={"refit": True},
                               profile="shots:2")
    with pytest.raises(UserError, match="--refit adds the val rows"):
        cfg.check()
