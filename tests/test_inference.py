"""The inference rule (mr2probe.inference): hand-computed cases of the two-stage SE, ν, p, TOST, its equivalence
bound, MDE and verdicts, and the rule on simulated tables (the repository's simulate_table): the null control's
95% CI covers 0 in 93–97% of 300 tables (a sanity bound; the calibration itself is benchmarks/calibration.py and
tests/test_calibration.py), and an effect of the stated MDE is found with about the stated 80% power."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from mr2probe.inference import ALPHA, VERDICTS, label, two_stage, verdicts
from mr2probe.metrics import bh_qvalues, null_name
from mr2probe.summary import cross_run, over_runs, summarize


def test_replicate_stage_alone_is_the_t_interval_of_the_mean() -> None:
    d = np.array([1.0, 2.0, 3.0])
    e = two_stage(d)
    se = np.std(d, ddof=1) / math.sqrt(3)  # = 1/√3
    assert e.estimate == 2.0 and e.se == pytest.approx(se) and e.df == pytest.approx(2)
    half = stats.t.ppf(0.975, 2) * se
    assert e.ci == pytest.approx((2 - half, 2 + half))
    assert e.p == pytest.approx(2 * stats.t.sf(2 / se, 2))
    assert e.mde == pytest.approx((stats.t.ppf(0.975, 2) + stats.t.ppf(0.8, 2)) * se)
    # TOST at ±1: max of the one-sided p's of H0 Δ ≤ −1 and H0 Δ ≥ +1
    assert e.p_equiv == pytest.approx(max(stats.t.sf(3 / se, 2), stats.t.sf(-1 / se, 2)))


def test_shared_image_noise_is_added_to_the_replicate_spread() -> None:
    """Draws [B, R]: deviations ±1 shared by the replicates (image noise common to all) and ±1 of their own. The
    replicates' spread already holds their own image noise; only the shared part is added, and ν = R − 1."""
    d = np.array([0.0, 1.0, 2.0])
    common = np.array([1.0, -1.0, 1.0, -1.0])[:, None]
    own = np.array([[1.0, -1.0, 0.0], [-1.0, 1.0, 0.0], [0.0, 1.0, -1.0], [0.0, -1.0, 1.0]])
    draws = d + common + own
    e = two_stage(d, draws=draws)
    cov = np.cov(draws, rowvar=False)
    shared = (cov.sum() - np.trace(cov)) / 6  # the mean off-diagonal covariance
    v_img = np.var(draws.mean(1), ddof=1)
    w = (np.trace(cov) - cov.sum() / 3) / 2  # what the image noise adds to the replicates' variance (draws' scale)
    assert v_img == pytest.approx(shared + w / 3)  # V_img = v_shared + w/G
    assert e.se == pytest.approx(math.sqrt(np.var(d, ddof=1) / 3 + shared)) and e.df == 2
    assert e.se_train == pytest.approx(math.sqrt(max(np.var(d, ddof=1) - w, 0) / 3))
    assert e.se_train ** 2 + e.se_image ** 2 == pytest.approx(e.se ** 2)
    e2 = two_stage(d * 3, draws=d * 3 + common + own)  # a larger spread: the same shared part, ν still 2
    assert e2.se == pytest.approx(math.sqrt(9.0 / 3 + shared)) and e2.df == 2


def test_a_negative_shared_estimate_keeps_half_the_replicate_part() -> None:
    d = np.array([0.0, 1.0, 2.0])
    anti = np.array([[3.0, -3.0, 0.0], [-3.0, 3.0, 0.0], [0.0, 3.0, -3.0], [0.0, -3.0, 3.0]])  # negative cov
    e = two_stage(d, draws=d + anti)
    assert e.se == pytest.approx(math.sqrt(np.var(d, ddof=1) / 3 / 2)) and e.df == 2


def test_replicates_with_one_value_keep_the_image_noise() -> None:
    """Three replicates with the same Δ (s² = 0) but differing predictions: the image stage alone, not SE = 0."""
    d = np.array([0.5, 0.5, 0.5])
    own = np.array([[1.0, -1.0, 0.0], [-1.0, 1.0, 0.0], [0.0, 1.0, -1.0], [0.0, -1.0, 1.0]])
    draws = d + own + np.array([1.0, -1.0, 1.0, -1.0])[:, None]
    e = two_stage(d, draws=draws)
    assert e.se == pytest.approx(np.std(draws.mean(1), ddof=1)) and e.se > 0 and e.df == 2


def test_equivalence_bound_is_the_smallest_margin_tost_accepts() -> None:
    e = two_stage(np.array([0.2, 0.5, 0.3, 0.4]))
    assert e.equiv_bound == pytest.approx(abs(e.estimate) + stats.t.ppf(0.95, 3) * e.se)
    assert two_stage(np.array([0.2, 0.5, 0.3, 0.4]), margin=e.equiv_bound * 1.001).p_equiv < 0.05
    assert two_stage(np.array([0.2, 0.5, 0.3, 0.4]), margin=e.equiv_bound * 0.999).p_equiv > 0.05


def test_episodes_are_clusters() -> None:
    """Two episodes × two seeds: the replicate stage uses the 2 episode means (ν = 1)."""
    d = np.array([1.0, 3.0, 5.0, 7.0])
    e = two_stage(d, clusters=np.array([0, 0, 1, 1]))
    assert e.clusters == 2 and e.df == pytest.approx(1)
    assert e.se == pytest.approx(np.std([2.0, 6.0], ddof=1) / math.sqrt(2))


def test_degenerate_cases() -> None:
    same = two_stage(np.zeros(3), draws=np.zeros((10, 3)))
    assert same.p == 1.0 and same.p_equiv == 0.0 and same.se == 0.0
    one = two_stage(np.array([1.0]))
    assert math.isnan(one.se) and "one replicate" in one.note
    single = two_stage(np.array([1.0]), draws=np.array([[1.0], [2.0], [0.5]]))
    assert math.isinf(single.df) and single.clusters == 1
    assert verdicts([single])[2] == ["underpowered"]  # one replicate: nothing measured about training


def test_verdicts_and_bh() -> None:
    effects = [two_stage(np.array(v)) for v in ([5.0, 5.1, 4.9], [-5.0, -5.1, -4.9], [0.01, -0.02, 0.0],
                                                [3.0, -4.0, 2.0])]
    q, q_eq, v = verdicts(effects)
    assert v == ["better", "worse", "equivalent", "inconclusive"]
    # the margin below what the table resolves (its MDE): not "equivalent"; a significant difference stays
    q, q_eq, v = verdicts(effects, resolution=np.full(4, 2.0), margin=1.0, identical=[False, False, False, True])
    assert v == ["better", "worse", "underpowered", "identical"]
    assert list(label([-1.0], [0.01], [1.0], higher_is_better=False)) == ["better"]  # a lower Gap is better
    assert np.all(q >= np.array([e.p for e in effects]))


# ---- simulated tables ---------------------------------------------------------------------------------------

K, N_PER, SEEDS = 6, 60, 3


def _split(rng: np.random.Generator, acc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Labels and predictions of one split: image i of class k is right with probability acc[k] (an image-level
    difficulty shared by every replicate would add to both; independent Bernoulli draws keep it simple)."""
    y = np.repeat(np.arange(K), N_PER)
    right = rng.random(len(y)) < acc[y]
    return y, np.where(right, y, (y + 1) % K)


def simulate_table(rng: np.random.Generator, effect: float = 0.0, noise: float = 0.04) -> tuple[dict, dict]:
    """results.json + predictions of one cell: ce, its null control and a method ``effect`` (probability) better on
    every class. Each replicate has class-level training noise shared by its val and test scores (what makes a
    pooled val ranking pick the reference's own unlucky classes)."""
    base = np.linspace(0.55, 0.9, K)
    y_test = np.repeat(np.arange(K), N_PER)
    runs, preds = [], {"test_labels": y_test}
    for method, offset, shift in (("ce", 0, 0.0), (null_name("ce"), SEEDS, 0.0), ("better", 0, effect)):
        for s in range(SEEDS):
            acc = np.clip(base + shift + rng.normal(0, noise, K), 0.01, 0.99)
            _, p_val = _split(rng, acc)
            y_val = np.repeat(np.arange(K), N_PER)
            _, p_test = _split(rng, acc)
            runs.append({"method": method, "seed": s + offset, "per_class_acc": _acc(p_test, y_test).tolist(),
                         "val_per_class_acc": _acc(p_val, y_val).tolist()})
            preds[f"{method}/{s + offset}"] = p_test
    results = {"class_names": [f"c{k}" for k in range(K)], "test_class_counts": [N_PER] * K, "reference": "ce",
               "runs": runs}
    return results, preds


def _acc(pred: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.bincount(y, weights=pred == y, minlength=K) / np.bincount(y, minlength=K)


@pytest.mark.slow
def test_the_null_control_is_calibrated_and_the_stated_mde_is_found() -> None:
    rng = np.random.default_rng(0)
    covered, mdes = [], []
    for _ in range(300):
        results, preds = simulate_table(rng)
        s = summarize(results, preds)
        e = s.inference[null_name("ce")]["ΔHard"]
        covered.append(e["ci"][0] <= 0 <= e["ci"][1])
        mdes.append(e["mde"])
    coverage = float(np.mean(covered))
    assert 0.93 <= coverage <= 0.97, coverage
    # the stated MDE is (t + t)·SE with SE estimated from few replicates: over tables its root mean square, not its
    # median (the median of an SE estimated with ν ≈ 2 lies well below the true SE), is (t + t)·σ
    mde = float(np.sqrt(np.mean(np.square(mdes))))
    found = []
    for _ in range(150):
        results, preds = simulate_table(rng, effect=mde / 100)
        found.append(summarize(results, preds).inference["better"]["ΔHard"]["p"] < ALPHA)
    assert 0.7 <= np.mean(found) <= 0.92, (mde, np.mean(found))


@pytest.mark.slow
def test_leave_one_out_groups_remove_the_selection_bias_of_pooled_groups() -> None:
    """A pooled val ranking lets the reference's own unlucky classes (training noise shared by val and test) be its
    hard ones: the null control's ΔHard is then biased upwards; ranked without the pair it scores, it is not."""
    rng = np.random.default_rng(2)
    pooled, loo = [], []
    for _ in range(600):
        results, _ = simulate_table(rng, noise=0.08)
        pooled.append(summarize(results, group_on="val-pooled").mean[null_name("ce")]["ΔHard"])
        loo.append(summarize(results).mean[null_name("ce")]["ΔHard"])
    se = np.std(loo, ddof=1) / math.sqrt(len(loo))
    assert np.mean(pooled) > 4 * se and abs(np.mean(loo)) < 2.5 * se, (np.mean(pooled), np.mean(loo), se)


def test_summaries_carry_q_values_and_verdicts_across_runs() -> None:
    rng = np.random.default_rng(1)
    items = []
    for i, effect in enumerate((0.0, 0.3)):
        results, preds = simulate_table(rng, effect)
        items.append((f"run{i}", summarize(results, preds)))
    df = cross_run(items)
    rows = df[df["method"] == "better"]
    assert rows["ΔHard_q_all"].notna().all() and set(rows["ΔHard_verdict_all"]) <= set(VERDICTS)
    assert rows["ΔHard_verdict_all"].iloc[0] == "underpowered"  # MDE ≈ 18 points against a ±1 point margin
    assert rows["ΔHard_verdict"].iloc[1] == "better"  # +30 points on every class, in its own table
    np.testing.assert_allclose(rows["ΔHard_q_all"], bh_qvalues(rows["ΔHard_p"].to_numpy()))  # one family of two
    counts = over_runs(df).loc["better"]
    assert counts[list(VERDICTS)].sum() == 2


def test_the_reference_check_names_the_checkpoints_each_method_chose() -> None:
    from mr2probe.report import reference_check_line

    results, preds = simulate_table(np.random.default_rng(3))
    ce = [r for r in results["runs"] if r["method"] == "ce"]
    for r, step in zip(ce, (8, 16, 16)):
        r["checkpoint_step"] = step
    results["runs"] += [{**r, "method": "logreg", "checkpoint_step": None} for r in ce]
    results["budget"] = {"steps": 16, "checkpoints": [8, 16]}
    s = summarize(results)
    line = reference_check_line(s)
    assert "checkpoints 8, 16 steps chosen per method on val, ce at 8, 16" in line and "within 0.5" in line


def test_identical_methods_underpowered_tables_notes_and_the_mr2_check() -> None:
    """A method predicting exactly as the reference is `identical` (not "equivalent"); an MR2-family method's
    margins and variability give the manipulation check; tied val accuracy at the hard group's edge is a warning."""
    from scipy.stats import spearmanr

    results, preds = simulate_table(np.random.default_rng(4))
    ce = [r for r in results["runs"] if r["method"] == "ce"]
    k = len(results["class_names"])
    for i, r in enumerate(ce):
        results["runs"].append({**r, "method": "mr2_uniform", "margins": list(np.linspace(1.0, 1.2 + i, k)),
                                "variability": list(np.linspace(3, 1, k) + i)})
        preds[f"mr2_uniform/{r['seed']}"] = preds[f"ce/{r['seed']}"]
    s = summarize(results, preds)
    assert s.verdict("mr2_uniform") == "identical" and s.identical["mr2_uniform"]
    assert s.verdict_text("mr2_uniform") == "identical"
    assert s.manipulation["mr2_uniform"]["margin_spread"] == pytest.approx(np.mean([1.2, 2.2, 3.2]))
    assert s.manipulation["mr2_uniform"]["premise_r"] == pytest.approx(spearmanr(np.linspace(3, 1, k),
                                                                                  s.rank_acc).statistic)
    assert any("manipulation check" in n for n in s.notes) and not any("decided by ties" in n for n in s.notes)
    frame = s.frame()
    assert frame.loc["mr2_uniform", "identical"] and np.isnan(frame.loc["better", "margin_spread"])
    assert np.isfinite(frame.loc["better", "ΔHard_equiv_bound"])
    for r in results["runs"]:
        r["val_per_class_acc"] = [1.0] * k  # every class at 1.0 on val: the hard group is a tie
    tied = summarize(results, preds)
    assert any("decided by ties" in n and "class order decides" in n for n in tied.notes)


def test_groups_are_ranked_within_the_episode_where_each_episode_has_its_own_rare_classes() -> None:
    """A long-tailed profile draws which classes are rare per episode: a replicate's hard classes are ranked on the
    other seeds of its own episode (ranked on the other episodes, the hard set would be another episode's rare
    classes, and Hard would read above All)."""
    k, rare = 6, {0: [0, 1], 1: [4, 5]}
    runs = []
    for method, offset, shift in (("ce", 0, 0.0), ("better", 0, 0.05)):
        for ep in (0, 1):
            for s in (0, 1):
                acc = np.full(k, 0.9) - 0.01 * np.arange(k) - 0.001 * s
                acc[rare[ep]] = 0.3 + shift
                runs.append({"method": method, "seed": s + offset, "episode": ep, "per_class_acc": acc.tolist(),
                             "val_per_class_acc": acc.tolist()})
    counts = {0: [5, 5, 50, 50, 50, 50], 1: [50, 50, 50, 50, 5, 5]}
    results = {"class_names": [f"c{i}" for i in range(k)], "test_class_counts": [10] * k, "reference": "ce",
               "runs": runs, "episodes": [{"episode": ep, "train_class_counts": counts[ep]} for ep in (0, 1)]}
    s = summarize(results)
    assert s.mean["ce"]["Hard"] == pytest.approx(30.0) and s.mean["ce"]["All"] < 70
    assert s.mean["better"]["ΔHard"] == pytest.approx(5.0)
    same = {**results, "episodes": [{"episode": ep, "train_class_counts": counts[0]} for ep in (0, 1)]}
    assert summarize(same).mean["ce"]["Hard"] > 80  # one class order declared: ranked on the other episode
    assert any(n.startswith("Groups per episode") for n in s.notes) and not summarize(same).notes
    assert not any("one seed of the reference" in n for n in s.notes)
    one_seed = {**results, "runs": [r for r in runs if r["seed"] == 0 or r["episode"] == 1]}
    warned = [n for n in summarize(one_seed).notes if "one seed of the reference" in n]
    assert warned and warned[0].startswith("Warning: 1 of 2 episodes")
