"""The protocol a reviewer can trust (../shared/spec/protocol.md): groups ranked on data they are not scored on,
the null control, sample SD, CIs of the seed mean, step budgets that converge, a cosine reference whose scale
is selected on val, and the CE probe against sklearn's LogisticRegression on real features."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

from conftest import BUNDLED, md_rows, run_cli
from mr2probe.experiment import ExperimentConfig, holdout_val, null_seeds, train_seed
from mr2probe.featurestore import read_features
from mr2probe.heads import ProbeConfig
from mr2probe.metrics import Bootstrap, Fold, Groups, null_name, stratified_halves
from mr2probe.report import summarize
from mr2probe.trainer import TrainConfig, TrainData, budget, expand_runs, train_stack


def results_for(acc: dict[str, list[list[float]]], val: dict[str, list[list[float]]] | None = None,
                seeds: dict[str, list[int]] | None = None, n_per_class: int = 10) -> dict:
    """A results dict with per-class test (and val) accuracies given by hand."""
    k = len(next(iter(acc.values()))[0])
    runs = [{"method": m, "seed": (seeds or {}).get(m, list(range(len(per))))[i], "per_class_acc": a,
             "val_per_class_acc": (val or acc)[m][i]}
            for m, per in acc.items() for i, a in enumerate(per)]
    return {"class_names": [f"c{i}" for i in range(k)], "test_class_counts": [n_per_class] * k,
            "reference": "ce", "runs": runs}


# ---- groups ------------------------------------------------------------------------------------------------

def test_groups_are_ranked_on_val_by_default_and_on_test_only_when_asked() -> None:
    # val ranks class 0 hardest, test ranks class 1 hardest
    r = results_for({"ce": [[0.9, 0.5, 0.7]]}, val={"ce": [[0.5, 0.9, 0.7]]})
    assert summarize(r).groups.hard.tolist() == [0] and summarize(r).group_on == "val"
    assert summarize(r, group_on="test").groups.hard.tolist() == [1]
    assert "ranked on val" in summarize(r).header() and summarize(r).as_dict()["groups_on"] == "val"


def test_stratified_halves_split_every_class_in_two() -> None:
    y = np.repeat(np.arange(4), [10, 7, 1, 4])
    a, b = stratified_halves(y, seed=0)
    assert len(np.intersect1d(a, b)) == 0 and sorted(np.concatenate([a, b]).tolist()) == list(range(len(y)))
    assert np.bincount(y[a], minlength=4).tolist() == [5, 3, 0, 2]
    assert np.bincount(y[b], minlength=4).tolist() == [5, 4, 1, 2]


def test_crossfit_ranks_on_one_half_and_scores_on_the_other() -> None:
    # 3 classes × 4 test images; the reference is right on the halves' images as designed below
    y = np.repeat(np.arange(3), 4)
    a, b = stratified_halves(y, seed=0)
    ref = y.copy()
    ref[a[y[a] == 0]] = 1  # on half a class 0 is always wrong → hard when ranked on a
    ref[b[y[b] == 2]] = 0  # on half b class 2 is always wrong → hard when ranked on b
    preds = {"test_labels": y, "ce/0": ref}
    acc = [np.mean(ref[y == c] == c) for c in range(3)]
    s = summarize(results_for({"ce": [acc]}, n_per_class=4), preds, group_on="crossfit")
    assert [f.groups.hard.tolist() for f in s.folds] == [[0], [2]]
    assert [f.rows.tolist() for f in s.folds] == [b.tolist(), a.tolist()]
    # Hard of the reference: class 0 scored on b (all right) and class 2 scored on a (all right) → 100%
    assert s.mean["ce"]["Hard"] == pytest.approx(100.0)
    # ranked and scored on the same images, the same predictions look maximally hard
    assert summarize(results_for({"ce": [acc]}, n_per_class=4), preds, group_on="test").mean["ce"]["Hard"] == \
        pytest.approx(50.0)


def _simulate(rng: np.random.Generator, k: int = 30, n: int = 40, seeds: int = 3) -> tuple[dict, dict]:
    """Reference and null control drawn from the same per-class accuracies (there is no effect to find)."""
    p = 0.8 + rng.uniform(-0.03, 0.03, size=k)
    y = np.repeat(np.arange(k), n)

    def predict() -> np.ndarray:
        right = rng.random(len(y)) < p[y]
        return np.where(right, y, (y + 1) % k)

    acc, val, preds = {"ce": [], "ce (null)": []}, {"ce": [], "ce (null)": []}, {"test_labels": y}
    for m, offset in (("ce", 0), ("ce (null)", seeds)):
        for s in range(seeds):
            pred = predict()
            preds[f"{m}/{s + offset}"] = pred
            acc[m].append([float(np.mean(pred[y == c] == c)) for c in range(k)])
            val[m].append((rng.binomial(n, p) / n).tolist())
    r = results_for(acc, val, {"ce": list(range(seeds)), "ce (null)": list(range(seeds, 2 * seeds))}, n)
    return r, preds


@pytest.mark.slow
def test_ranking_on_test_credits_a_null_method_and_val_or_crossfit_do_not() -> None:
    """Regression to the mean: classes ranked hard on the reference's own test accuracy were partly unlucky, so
    anything else scores higher on them. Over 30 simulated files with no effect, ΔHard of the null control is
    clearly positive with --groups-on test and about 0 with val or crossfit."""
    rng = np.random.default_rng(0)
    delta = {g: [] for g in ("test", "val", "crossfit")}
    for _ in range(30):
        r, preds = _simulate(rng)
        for g in delta:
            delta[g].append(summarize(r, preds, group_on=g).mean["ce (null)"]["ΔHard"])
    mean = {g: float(np.mean(v)) for g, v in delta.items()}
    assert mean["test"] > 2.0, mean
    assert abs(mean["val"]) < 0.6 and abs(mean["crossfit"]) < 0.6, mean


# ---- spread and intervals ----------------------------------------------------------------------------------

def test_spread_is_the_sample_sd_and_the_null_row_is_no_bold_candidate() -> None:
    r = results_for({"ce": [[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]], "mr2": [[0.4, 0.5, 0.6], [0.6, 0.7, 0.8]],
                     "ce (null)": [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]},
                    seeds={"ce (null)": [2, 3]})
    s = summarize(r)
    assert s.mean["mr2"]["All"] == pytest.approx(60.0)
    assert s.std["mr2"]["All"] == pytest.approx(np.std([50.0, 70.0], ddof=1))  # 14.14, not 10
    assert s.null == "ce (null)" and "ce (null)" not in s.best("All") and s.best("All") == {"mr2"}
    assert s.mean["ce (null)"]["ΔAll"] == pytest.approx(50.0)  # paired by position with ce's seeds 0, 1
    assert "ce (null)" not in summarize(r, null=False).methods
    one = summarize(results_for({"ce": [[0.5, 0.5, 0.5]]}))
    assert np.isnan(one.std["ce"]["All"])  # one seed: no spread, not 0


def test_draws_are_shared_by_the_replicates_so_their_mean_is_paired() -> None:
    """Two test images of one class; replicate 0 is right on image 0 only, replicate 1 on image 1 only. Every
    resample (i, j) gives the two replicates accuracies that add up to 1, so their mean is 50% in every draw,
    while each replicate alone takes 0, 50 or 100; the reference right on both is 100 in every draw."""
    y = np.array([0, 0])
    folds = [Fold(np.arange(2), Groups(np.array([0]), np.array([], int), np.array([0])))]
    boot = Bootstrap(y, folds, num_classes=1, draws=200, seed=0)
    r = boot.rows([np.array([0, 1]), np.array([1, 0])], y)
    assert r["All"].shape == (200, 2)
    np.testing.assert_allclose(r["All"].mean(1), 50.0)
    assert set(np.unique(r["All"][:, 0])) == {0.0, 50.0, 100.0}
    np.testing.assert_allclose(r["Hard"], r["All"])  # the one class is the hard group
    ref = boot.rows([y, y], y)
    np.testing.assert_allclose(r["All"].mean(1) - ref["All"].mean(1), -50.0)


def test_bootstrap_rows_equal_a_direct_computation() -> None:
    rng = np.random.default_rng(1)
    y = rng.integers(0, 4, 60)
    pred = np.where(rng.random(60) < 0.7, y, rng.integers(0, 4, 60))
    groups = Groups(np.array([1]), np.array([2, 3]), np.array([0]))
    boot = Bootstrap(y, [Fold(np.arange(60), groups)], 4, draws=5, seed=3)
    got = boot.rows([pred], y)
    other = Groups(np.array([2]), np.array([1, 3]), np.array([0]))  # a replicate scored with groups of its own
    mine = boot.rows([pred], y, [[other]])
    for b in range(5):
        idx = np.repeat(np.arange(60), boot.weights[0][b].astype(int))  # the rows draw b takes, as often
        yy, pp = y[idx], pred[idx]
        acc = [np.mean(pp[yy == k] == k) for k in range(4)]
        assert got["All"][b, 0] == pytest.approx(100 * np.mean(pp == yy))
        assert got["Hard"][b, 0] == pytest.approx(100 * acc[1])
        assert got["Easy"][b, 0] == pytest.approx(100 * acc[0])
        assert got["Worst"][b, 0] == pytest.approx(100 * min(acc))
        assert got["Gap"][b, 0] == pytest.approx(100 * (acc[0] - acc[1]))
        assert mine["Hard"][b, 0] == pytest.approx(100 * acc[2])


# ---- budget ------------------------------------------------------------------------------------------------

def test_budget_is_a_number_of_steps_with_a_floor() -> None:
    cfg = TrainConfig(epochs=30, batch_size=512, min_steps=1000)
    assert budget(54_000, cfg) == (30, 106)  # large: epochs decide (3,180 steps)
    assert budget(1_020, cfg) == (500, 2)  # Flowers-102 size: 1,000 steps instead of 60
    assert budget(100, cfg) == (1000, 1)  # 10-shot × 10 classes: 1,000 steps instead of 30
    assert budget(100, cfg, epochs=333) == (333, 1)  # an auxiliary stage sized from the floored epochs
    assert budget(100, TrainConfig(min_steps=0)) == (30, 1)


@pytest.mark.slow
def test_train_records_the_budget_null_control_and_train_counts(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = run_cli("train", "--methods", "ce,focal", "--seeds", "2", "--epochs", "1", "--min-steps", "6",
                "--batch-size", "1024", "--out", str(out), "-q")
    assert r.returncode == 0, r.stderr
    res = json.loads((out / "results.json").read_text())
    assert res["budget"]["steps"] == 6 and res["budget"]["epochs"] == 3 and res["budget"]["steps_per_epoch"] == 2
    assert res["null_control"] == {"method": "ce (null)", "seeds": [2, 3]} and null_seeds([0, 1]) == [2, 3]
    assert sorted({(x["method"], x["seed"]) for x in res["runs"]}) == [
        ("ce", 0), ("ce", 1), ("ce (null)", 2), ("ce (null)", 3), ("focal", 0), ("focal", 1)]
    assert sum(res["train_class_counts"]) == res["provenance"]["splits"]["train"]
    table = (out / "table.md").read_text()
    assert "ce (null)" in [r["method"] for r in md_rows(table, "method")]
    assert "ranked on val" in table and "sample SD" in table
    # the null control's seeds are ordinary `ce` seeds: a ce-only run on seeds 0..3 reuses them
    r = run_cli("train", "--methods", "ce", "--seeds", "4", "--epochs", "1", "--min-steps", "6",
                "--batch-size", "1024", "--no-null", "--out", str(out), "-q")
    assert r.returncode == 0, r.stderr
    notes = json.loads((out / "results.json").read_text())["notes"]
    assert sum("already trained" in n for n in notes) == 2  # seeds 2 and 3 (0, 1 had another method set)
    assert "ce (null)" not in [r["method"] for r in md_rows((out / "table.md").read_text(), "method")]


@pytest.mark.parametrize("args, message", [
    (["--min-steps", "-1"], "--min-steps must be ≥ 0"),
    (["--scale", "16,0", "--head", "cosine"], "--scale values must be finite and > 0"),
    (["--groups-on", "train"], "--groups-on must be one of val, val-pooled, crossfit, test"),
    (["--equivalence-margin", "0"], "--equivalence-margin must be > 0"),
])
def test_bad_protocol_flags_are_one_line_errors(tmp_path: Path, args: list[str], message: str) -> None:
    r = run_cli("train", *args, "--out", str(tmp_path / "r"), "-q")
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("error: ") and message in r.stderr
    assert not (tmp_path / "r" / "results.json").exists()


def test_report_groups_on_is_checked(tmp_path: Path) -> None:
    r = run_cli("report", str(tmp_path), "--groups-on", "nope")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


# ---- the reference: converged and not under-fit ------------------------------------------------------------

@pytest.fixture(scope="module")
def bundled() -> dict[str, np.ndarray]:
    fs = read_features(BUNDLED)
    x, y = fs.splits["train"].features.astype(np.float32), fs.splits["train"].labels
    keep, held = holdout_val(y, 0.1, 0)
    return {"x": x[keep], "y": y[keep], "vx": x[held], "vy": y[held],
            "tx": fs.splits["test"].features.astype(np.float32), "ty": fs.splits["test"].labels}


def _ce_vs_logreg(d: dict[str, np.ndarray], rows: np.ndarray, head: str = "linear") -> tuple[float, float]:
    """Test accuracy of the CE probe (grid on val, default budget) and of LogisticRegression (C on val)."""
    x, y = d["x"][rows], d["y"][rows]
    best = max((LogisticRegression(C=c, max_iter=3000).fit(x, y) for c in np.logspace(-3, 1, 9)),
               key=lambda m: m.score(d["vx"], d["vy"]))
    t = lambda a, dt=torch.float32: torch.as_tensor(a, dtype=dt)  # noqa: E731
    data = TrainData(t(x), t(y, torch.long), t(d["vx"]), t(d["vy"], torch.long), 10)
    cfg = ExperimentConfig(features=BUNDLED, out=Path("."), methods=["ce"],
                           train=TrainConfig(progress=False, probe=ProbeConfig(head=head)))
    runs, _, _ = train_seed(data, (t(d["tx"]), t(d["ty"], torch.long)), cfg, 0, lambda m: None)
    return runs[0].test_acc, best.score(d["tx"], d["ty"])


@pytest.mark.slow
def test_ce_probe_reaches_logistic_regression_on_real_features(bundled) -> None:
    """Bundled Fashion-MNIST × EfficientNet-Lite0 (1,800 train, 200 val, 2,000 test): CE ≥ LogReg − 0.5 pt."""
    ours, ref = _ce_vs_logreg(bundled, np.arange(len(bundled["y"])))
    assert ours >= ref - 0.005, (ours, ref)


def test_ce_probe_reaches_logistic_regression_on_a_10_shot_subset(bundled) -> None:
    """10 training images per class (100 rows: 1 step per epoch, so the budget floor is what trains it)."""
    rng = np.random.default_rng(0)
    y = bundled["y"]
    rows = np.concatenate([rng.choice(np.flatnonzero(y == c), 10, replace=False) for c in range(10)])
    ours, ref = _ce_vs_logreg(bundled, rows)
    assert ours >= ref - 0.005, (ours, ref)


@pytest.mark.slow
def test_cosine_reference_is_within_2_points_of_linear(bundled) -> None:
    """The cosine head's scale is selected on val (8 … 256): its CE reference is not under-fit."""
    rows = np.arange(len(bundled["y"]))
    cos, _ = _ce_vs_logreg(bundled, rows, head="cosine")
    lin, _ = _ce_vs_logreg(bundled, rows)
    assert cos >= lin - 0.02, (cos, lin)


def test_cosine_scale_is_a_per_head_hyperparameter_equal_to_solo_runs() -> None:
    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.normal(size=(64, 6)), dtype=torch.float64)
    y = torch.as_tensor(np.arange(64) % 3)
    data = TrainData(x, y, x, y, 3)
    cfg = TrainConfig(epochs=3, batch_size=16, lr=(1e-2,), wd=(0.0,), min_steps=0, scale=(8.0, 32.0),
                      probe=ProbeConfig(head="cosine"), method_grid=False, progress=False)
    specs = expand_runs(["ce"], [0], cfg)
    assert [s.params["scale"] for s in specs] == [8.0, 32.0]
    stacked = train_stack(data, specs, cfg).predict(x)
    for i, scale in enumerate((8.0, 32.0)):
        solo_cfg = TrainConfig(**{**cfg.__dict__, "scale": (scale,)})
        solo = train_stack(data, expand_runs(["ce"], [0], solo_cfg), solo_cfg).predict(x)
        torch.testing.assert_close(stacked[i], solo[0], rtol=1e-9, atol=1e-9)


def test_l2_penalty_converges_to_the_logistic_regression_optimum() -> None:
    """½·l2·‖W‖² with l2 = 1/(C·n) is sklearn's L2 logistic regression objective (mean form): the trained probe's
    probabilities match LogisticRegression(C) on the same data."""
    rng = np.random.default_rng(0)
    n, c = 150, 0.5
    x = rng.normal(size=(n, 5)) + np.repeat(rng.normal(0, 1.5, (3, 5)), n // 3, axis=0)
    y = np.repeat(np.arange(3), n // 3)
    sk = LogisticRegression(C=c, tol=1e-10, max_iter=10_000).fit(x, y)
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)
    cfg = TrainConfig(epochs=1, batch_size=n, lr=(5e-2,), wd=(0.0,), l2=(1 / (c * n),),
                      min_steps=4000, method_grid=False, progress=False)
    probs = train_stack(TrainData(xt, yt, xt, yt, 3), expand_runs(["ce"], [0], cfg), cfg).predict(xt)[0].softmax(-1)
    np.testing.assert_allclose(probs.numpy(), sk.predict_proba(x), atol=5e-3)


def test_null_name_is_the_reference_with_a_suffix() -> None:
    assert null_name("ce") == "ce (null)"
