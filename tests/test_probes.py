"""Reference probes (mr2probe/probes.py): logreg is sklearn's LogisticRegression objective solved to its optimum,
knn is DINO's temperature-weighted cosine kNN (and sklearn's KNeighborsClassifier with the same weights), the
hyperparameter is the first best on val, and bad values are one-line UserErrors."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import KNeighborsClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from conftest import BUNDLED
from mr2probe.errors import UserError
from mr2probe.featurestore import read_features
from mr2probe.probes import (PROBES, REFERENCE_PROBES, fit_logreg, fit_reference_probe, knn_predict, knn_votes,
                             logreg_objective, score)

T = torch.as_tensor


@pytest.fixture(scope="module")
def bundled() -> dict[str, np.ndarray]:
    """Fashion-MNIST × EfficientNet-Lite0: 2,000 train, 2,000 test, D = 1280, K = 10 (float16 on disk)."""
    fs = read_features(BUNDLED)
    return {"x": fs.splits["train"].features.astype(np.float32), "y": fs.splits["train"].labels,
            "tx": fs.splits["test"].features.astype(np.float32), "ty": fs.splits["test"].labels}


def gaussians(n: int = 240, k: int = 4, d: int = 8, seed: int = 0, sep: float = 1.5,
              counts: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Overlapping Gaussian classes (so C matters), class c has ``counts[c]`` rows (default balanced)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, sep, size=(k, d))
    y = np.repeat(np.arange(k), counts) if counts else np.arange(n) % k
    x = centers[y] + rng.normal(size=(len(y), d)) + 0.5  # an offset: the intercept matters
    return x.astype(np.float32), y.astype(np.int64)


# ---- logreg ---------------------------------------------------------------------------------------------------

def test_logreg_matches_sklearn_on_the_bundled_features(bundled) -> None:
    """C = 0.01 on the raw 1280-d features: the same test predictions as LogisticRegression(C) within 0.3 pt
    (measured: identical accuracy, 100% agreement, max |Δp| ≈ 1e-4)."""
    d, c = bundled, 0.01
    sk = LogisticRegression(C=c, tol=1e-6, max_iter=5000).fit(d["x"].astype(np.float64), d["y"])
    ps = sk.predict_proba(d["tx"].astype(np.float64))
    res = fit_reference_probe("logreg", T(d["x"]), T(d["y"]), T(d["tx"]), T(d["ty"]), T(d["tx"]), 10, C=c)
    p = res.model.predict_proba(T(d["tx"])).numpy()
    assert res.model.converged and res.hparams == {"C": c}
    assert abs(np.mean(res.test_pred == d["ty"]) - sk.score(d["tx"], d["ty"])) <= 0.003
    assert np.mean(res.test_pred == ps.argmax(1)) >= 0.997
    assert np.abs(p - ps).max() < 2e-3


@pytest.mark.parametrize("c", [0.01, 1.0, 100.0])
def test_logreg_matches_sklearn_on_a_synthetic_set(c: float) -> None:
    """float32 (the probe's path) at tol 1e-7: same predictions, probabilities within 1e-3 (measured ≤ 4e-4).
    float64 solved tightly: the same W (unique: the penalty fixes it), b up to the softmax's constant shift, and
    an objective value no higher than sklearn's (lbfgs stops sklearn at max|∇| ≈ 1e-8 by its ftol, ours goes
    to 1e-10)."""
    x, y = gaussians()
    tx, ty = gaussians(seed=1)
    sk = LogisticRegression(C=c, tol=1e-10, max_iter=20_000).fit(x.astype(np.float64), y)
    ps = sk.predict_proba(tx.astype(np.float64))
    res = fit_reference_probe("logreg", T(x), T(y), T(tx), T(ty), T(tx), 4, C=c, tol=1e-7)  # float32's floor
    assert abs(np.mean(res.test_pred == ty) - sk.score(tx, ty)) <= 0.003 and res.model.converged
    np.testing.assert_allclose(res.model.predict_proba(T(tx)).numpy(), ps, atol=1e-3)
    xd = T(x).double()
    m = fit_logreg(xd, T(y), 4, c, tol=1e-10, max_iter=5000)
    assert m.converged
    np.testing.assert_allclose(m.weight.numpy(), sk.coef_, atol=1e-4 * max(1.0, np.abs(sk.coef_).max()))
    b = m.bias.numpy()
    np.testing.assert_allclose(b - b.mean(), sk.intercept_ - sk.intercept_.mean(), atol=1e-4)
    np.testing.assert_allclose(m.predict_proba(T(tx).double()).numpy(), ps, atol=1e-5)
    f_ours = logreg_objective(m.weight, m.bias, xd, T(y), c)[0]
    f_sk = logreg_objective(T(sk.coef_), T(sk.intercept_), xd, T(y), c)[0]
    assert f_ours <= f_sk + 1e-13


@pytest.mark.parametrize("c", [0.1, 10.0])
def test_logreg_balanced_matches_sklearns_class_weight_balanced(c: float) -> None:
    """A long tail (60/30/12/6 rows): logreg_balanced = LogisticRegression(C, class_weight="balanced") — the same W
    in float64, the same predictions in float32; it differs from plain logreg (the weights matter here) and
    raises the tail classes' recall."""
    x, y = gaussians(k=4, counts=[60 + 50, 30 + 50, 12 + 50, 6 + 50], sep=1.0)  # one draw: train and test
    test = np.concatenate([np.flatnonzero(y == k)[:50] for k in range(4)])  # 50 of each class
    x, y, tx, ty = np.delete(x, test, 0), np.delete(y, test), x[test], y[test]
    sk = LogisticRegression(C=c, class_weight="balanced", tol=1e-10, max_iter=20_000).fit(x.astype(np.float64), y)
    m = fit_logreg(T(x).double(), T(y), 4, c, tol=1e-10, max_iter=5000, class_weight="balanced")
    assert m.converged
    np.testing.assert_allclose(m.weight.numpy(), sk.coef_, atol=1e-4 * max(1.0, np.abs(sk.coef_).max()))
    np.testing.assert_allclose(m.predict_proba(T(tx).double()).numpy(), sk.predict_proba(tx), atol=1e-5)
    res = fit_reference_probe("logreg_balanced", T(x), T(y), T(tx), T(ty), T(tx), 4, C=c, tol=1e-7)
    assert res.name == "logreg_balanced" and res.info["class_weight"] == "balanced"
    assert np.mean(res.test_pred == sk.predict(tx)) >= 0.99
    plain = fit_reference_probe("logreg", T(x), T(y), T(tx), T(ty), T(tx), 4, C=c, tol=1e-7)
    assert not np.array_equal(plain.test_pred, res.test_pred)
    assert score(res.test_pred, ty, 4, "macc") > score(plain.test_pred, ty, 4, "macc")


def test_balanced_weights_by_hand() -> None:
    """n / (K' n_k) with K' the classes present: y = [0, 0, 0, 2] in K = 3 → 4/(2·3), 4/(2·1)."""
    from mr2probe.probes import balanced_weights

    w = balanced_weights(T([0, 0, 0, 2]), 3).numpy()
    np.testing.assert_allclose(w, [2 / 3, 2 / 3, 2 / 3, 2.0])
    assert w.sum() == pytest.approx(4)


def test_logreg_standardize_is_sklearns_standard_scaler_pipeline() -> None:
    x, y = gaussians()
    x[:, 0] *= 50.0  # scales that differ per feature, so standardising changes the optimum
    pipe = make_pipeline(StandardScaler(), LogisticRegression(C=0.1, tol=1e-10, max_iter=20_000))
    pipe.fit(x.astype(np.float64), y)
    m = fit_logreg(T(x).double(), T(y), 4, 0.1, tol=1e-10, max_iter=5000, standardize=True)
    np.testing.assert_allclose(m.predict_proba(T(x).double()).numpy(), pipe.predict_proba(x.astype(np.float64)),
                               atol=1e-5)


def test_logreg_two_classes_is_sklearns_binary_model_at_twice_c() -> None:
    """K = 2 keeps two softmax rows, w₀ = −w₁ at the optimum, so ‖W‖² = ‖w₁ − w₀‖²/2: sklearn's binary C is 2C."""
    x, y = gaussians(k=2, sep=0.7)
    m = fit_logreg(T(x).double(), T(y), 2, 0.05, tol=1e-10, max_iter=5000)
    sk = LogisticRegression(C=0.1, tol=1e-10, max_iter=20_000).fit(x.astype(np.float64), y)
    np.testing.assert_allclose(m.predict_proba(T(x).double()).numpy(), sk.predict_proba(x.astype(np.float64)),
                               atol=1e-5)


def test_logreg_objective_and_gradient_by_hand_and_zero_at_the_optimum() -> None:
    """f = mean CE + ‖W‖²/(2Cn) (b unpenalised): value and gradient against autograd at a random point (also in
    the centred parametrisation), and ∇f ≈ 0 at the fitted optimum, which attains sklearn's objective value."""
    x, y = gaussians(n=30, k=3, d=4, seed=3)
    xd, yd, c, n = T(x).double(), T(y), 0.3, len(y)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, generator=g, dtype=torch.float64, requires_grad=True)
    f_ref = torch.nn.functional.cross_entropy(xd @ w.T + b, yd, reduction="sum") / n + (w ** 2).sum() / (2 * c * n)
    f_ref.backward()
    f, g_w, g_b = logreg_objective(w.detach(), b.detach(), xd, yd, c, chunk_rows=7)  # chunks of 7 rows
    assert f == pytest.approx(f_ref.item(), rel=1e-12)
    torch.testing.assert_close(g_w, w.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g_b, b.grad, rtol=1e-10, atol=1e-12)
    mu = xd.mean(0)  # the centred parametrisation the solver uses: logits (x − μ)Wᵀ + b
    w.grad = b.grad = None
    ce = torch.nn.functional.cross_entropy((xd - mu) @ w.T + b, yd, reduction="sum")
    f_ref = ce / n + (w ** 2).sum() / (2 * c * n)
    f_ref.backward()
    f, g_w, g_b = logreg_objective(w.detach(), b.detach(), xd, yd, c, chunk_rows=7, center=mu)
    assert f == pytest.approx(f_ref.item(), rel=1e-12)
    torch.testing.assert_close(g_w, w.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g_b, b.grad, rtol=1e-10, atol=1e-12)
    m = fit_logreg(xd, yd, 3, c, tol=1e-12, max_iter=5000)
    f_opt, g_w, g_b = logreg_objective(m.weight, m.bias, xd, yd, c)
    assert float(torch.cat([g_w.flatten(), g_b]).norm()) < 1e-10
    sk = LogisticRegression(C=c, tol=1e-12, max_iter=20_000).fit(x.astype(np.float64), y)
    f_sk, _, _ = logreg_objective(T(sk.coef_), T(sk.intercept_), xd, yd, c)
    assert f_opt <= f_sk + 1e-12 and f_sk - f_opt < 1e-9


@pytest.mark.parametrize("select", ["acc", "macc"])
def test_logreg_c_chosen_on_val_is_the_first_best_of_a_direct_loop(select: str) -> None:
    counts = [120, 60, 30, 15]  # imbalanced: acc and macc may pick differently
    x, y = gaussians(counts=counts, seed=4, sep=1.0)
    vx, vy = gaussians(counts=counts, seed=5, sep=1.0)
    cs = [1e-3, 1e-2, 1e-1, 1.0, 10.0]
    res = fit_reference_probe("logreg", T(x), T(y), T(vx), T(vy), T(vx), 4, select=select, Cs=cs, tol=1e-7)
    direct = [score(fit_logreg(T(x), T(y), 4, c, tol=1e-7).predict(T(vx)).numpy(), vy, 4, select) for c in cs]
    assert [r["hparams"]["C"] for r in res.grid] == cs
    np.testing.assert_allclose([r["val_score"] for r in res.grid], direct, atol=1e-12)
    assert res.hparams["C"] == cs[int(np.argmax(direct))]  # argmax: the first of equal scores
    assert res.val_score == max(direct) and len(set(direct)) > 1
    assert all(r["info"]["converged"] for r in res.grid)


def test_logreg_is_deterministic_on_cpu() -> None:
    x, y = gaussians()
    a = fit_reference_probe("logreg", T(x), T(y), T(x), T(y), T(x), 4, Cs=[0.01, 1.0])
    b = fit_reference_probe("logreg", T(x), T(y), T(x), T(y), T(x), 4, Cs=[0.01, 1.0])
    assert torch.equal(a.model.weight, b.model.weight) and torch.equal(a.model.bias, b.model.bias)
    assert a.grid == b.grid and np.array_equal(a.test_pred, b.test_pred)


# ---- knn ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("weighting", ["uniform", "temperature"])
def test_knn_matches_sklearn_on_the_bundled_features(bundled, weighting: str) -> None:
    """KNeighborsClassifier(metric="cosine") with weights 'uniform' or exp((1 − d)/T), d = 1 − s: within 0.3 pt
    (measured: identical predictions for k = 10, 50, 200)."""
    d, t = bundled, 0.07
    weights = "uniform" if weighting == "uniform" else (lambda dist: np.exp((1.0 - dist) / t))
    for k in (10, 200):
        sk = KNeighborsClassifier(n_neighbors=k, metric="cosine", weights=weights, algorithm="brute")
        sk_pred = sk.fit(d["x"], d["y"]).predict(d["tx"])
        ours = knn_predict(T(d["x"]), T(d["y"]), T(d["tx"]), 10, k, t, weighting).numpy()
        assert abs(np.mean(ours == d["ty"]) - np.mean(sk_pred == d["ty"])) <= 0.003
        assert np.mean(ours == sk_pred) >= 0.997


def test_knn_votes_by_hand() -> None:
    """Query (1, 0.2) against four points: similarities s = 0.981 (class 0), 0.832 (1), 0.196 (1), −0.981 (0).
    k = 3 uniform: 1 vs 2 votes → class 1. k = 3, T = 0.1: e^{9.81} vs e^{8.32} + e^{1.96} → class 0. Votes are
    reported divided by e^{s_max/T} (argmax unchanged). k = 2 uniform: a 1–1 tie → the lower class, 0."""
    train = T([[1.0, 0.0], [1.0, 1.0], [0.0, 3.0], [-2.0, 0.0]])  # norms differ: only directions count
    labels = T([0, 1, 1, 0])
    q = T([[1.0, 0.2]])
    s = torch.nn.functional.normalize(train, dim=1) @ torch.nn.functional.normalize(q, dim=1)[0]
    uni = knn_votes(train, labels, q, 2, [2, 3], weighting="uniform")
    torch.testing.assert_close(uni[3], T([[1.0, 2.0]]))
    torch.testing.assert_close(uni[2], T([[1.0, 1.0]]))
    tv = knn_votes(train, labels, q, 2, [3], temperature=0.1)[3]
    expect = T([[1.0, float(torch.exp((s[1] - s[0]) / 0.1) + torch.exp((s[2] - s[0]) / 0.1))]])
    torch.testing.assert_close(tv, expect)
    assert knn_predict(train, labels, q, 2, 3, weighting="uniform").tolist() == [1]
    assert knn_predict(train, labels, q, 2, 3, temperature=0.1).tolist() == [0]
    assert knn_predict(train, labels, q, 2, 2, weighting="uniform").tolist() == [0]  # tie → lowest class
    big = knn_votes(train, labels, q, 2, [4], temperature=1e-4)[4]  # no overflow: the nearest dominates
    assert torch.isfinite(big).all() and big.argmax().item() == 0


def test_knn_k_chosen_on_val_is_the_first_best_and_the_grid_is_clipped() -> None:
    x, y = gaussians(n=60, seed=6, sep=1.0)
    vx, vy = gaussians(n=80, seed=7, sep=1.0)
    res = fit_reference_probe("knn", T(x), T(y), T(vx), T(vy), T(vx), 4, ks=(1, 3, 9, 100, 200), chunk_rows=16)
    ks = [1, 3, 9, 60]  # 100 and 200 clipped to N = 60, once
    assert [r["hparams"]["k"] for r in res.grid] == ks
    direct = [score(knn_predict(T(x), T(y), T(vx), 4, k).numpy(), vy, 4) for k in ks]
    np.testing.assert_allclose([r["val_score"] for r in res.grid], direct)
    assert res.hparams["k"] == ks[int(np.argmax(direct))] and res.val_score == max(direct)
    assert np.array_equal(res.test_pred, res.val_pred)  # test_x = val_x here
    one = fit_reference_probe("knn", T(x), T(y), T(vx), T(vy), None, 4, k=3, weighting="uniform")
    assert one.hparams == {"k": 3, "temperature": None, "weighting": "uniform"} and one.test_pred is None


def test_chunking_does_not_change_knn() -> None:
    x, y = gaussians(n=50, seed=8)
    q, _ = gaussians(n=33, seed=9)
    whole = knn_votes(T(x), T(y), T(q), 4, [5, 20])
    parts = knn_votes(T(x), T(y), T(q), 4, [5, 20], chunk_rows=4)
    for k in (5, 20):
        torch.testing.assert_close(whole[k], parts[k])


# ---- interface and bad values ---------------------------------------------------------------------------------

def test_registry_holds_the_reference_probes() -> None:
    assert sorted(REFERENCE_PROBES) == PROBES.names() == ["knn", "logreg", "logreg_balanced"]


@pytest.mark.parametrize("name, kwargs", [
    ("logreg", {"C": 0.0}), ("logreg", {"C": -1.0}), ("logreg", {"Cs": [0.1, float("nan")]}), ("logreg", {"Cs": []}),
    ("logreg", {"tol": 0.0}), ("logreg", {"max_iter": 0}), ("knn", {"k": 0}), ("knn", {"ks": [5, -1]}),
    ("knn", {"k": 2.5}), ("knn", {"temperature": 0.0}), ("knn", {"temperature": -0.07}),
    ("knn", {"weighting": "distance"}), ("knn", {"C": 1.0}), ("logreg", {"k": 5}), ("svm", {}),
    ("logreg", {"select": "f1"}), ("logreg_balanced", {"C": 0.0}), ("logreg_balanced", {"class_weight": "x"}),
    ("knn", {"num_classes": 3}),  # labels in [0, 4) but K = 3
])
def test_bad_values_raise_one_line_user_errors(name: str, kwargs: dict) -> None:
    x, y = gaussians(n=40)
    args = {"select": "acc", "num_classes": 4}
    args.update({k: kwargs.pop(k) for k in list(kwargs) if k in args})
    with pytest.raises(UserError) as e:
        fit_reference_probe(name, T(x), T(y), T(x), T(y), T(x), args["num_classes"], select=args["select"], **kwargs)
    assert len(str(e.value).splitlines()) == 1
