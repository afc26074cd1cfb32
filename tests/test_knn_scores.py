"""kNN class scores (the vote shares, sklearn's ``predict_proba``) and the top-k accuracy they define, by hand."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mr2probe.probes import KNNModel, fit_reference_probe, knn_predict
from mr2probe.selection import top_k_hits

ANGLES = [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]  # degrees; cos similarity to the query at 0° falls with the angle
LABELS = [0, 1, 1, 2, 3, 4]
K = 7  # classes 5 and 6 have no training rows near the query (and no votes)


def unit(degrees: list[float]) -> torch.Tensor:
    r = torch.tensor(degrees, dtype=torch.float64) * math.pi / 180
    return torch.stack([r.cos(), r.sin()], 1).float()


def test_uniform_vote_shares_and_top5_by_hand() -> None:
    """k = 4 uniform: the neighbours at 0°, 10°, 20°, 30° vote 0, 1, 1, 2 → shares (¼, ½, ¼, 0, 0, 0, 0).
    Ranked with ties to the lowest class: 1, 0, 2, then the zero-vote classes 3, 4 (5 and 6 fall outside the top 5)."""
    model = KNNModel(unit(ANGLES), torch.tensor(LABELS), K, k=4, weighting="uniform")
    q = unit([0.0])
    torch.testing.assert_close(model.predict_proba(q), torch.tensor([[0.25, 0.5, 0.25, 0, 0, 0, 0]]))
    assert model.predict(q).tolist() == [1] == knn_predict(unit(ANGLES), torch.tensor(LABELS), q, K, 4,
                                                           weighting="uniform").tolist()
    scores = model.logits(q).expand(K, K)  # the same query once per true class y = 0 … 6
    hits = top_k_hits(scores, torch.arange(K), k=5)
    assert hits.tolist() == [True, True, True, True, True, False, False]
    assert top_k_hits(scores, torch.arange(K), k=1).tolist() == [False, True] + [False] * 5
    assert top_k_hits(scores, torch.arange(K), k=2).tolist() == [True, True] + [False] * 5  # 0 beats 2 on the tie


def test_temperature_vote_shares_by_hand() -> None:
    """k = 3, T = 0.1: weights exp(cos θ_j / T) for θ = 0°, 10°, 20° (classes 0, 1, 1); shares w / Σ w."""
    t = 0.1
    w = np.exp(np.cos(np.radians([0.0, 10.0, 20.0])) / t)
    expect = np.zeros(K)
    expect[0], expect[1] = w[0] / w.sum(), (w[1] + w[2]) / w.sum()
    model = KNNModel(unit(ANGLES), torch.tensor(LABELS), K, k=3, temperature=t)
    p = model.predict_proba(unit([0.0]))
    np.testing.assert_allclose(p.numpy()[0], expect, rtol=1e-5, atol=1e-7)
    assert float(p.sum()) == pytest.approx(1.0) and model.predict(unit([0.0])).tolist() == [1]


def test_the_knn_probe_returns_its_model_with_the_chosen_k() -> None:
    x = unit(ANGLES * 3)
    y = torch.tensor(LABELS * 3)
    res = fit_reference_probe("knn", x, y, x, y, x, K, ks=(1, 3), weighting="uniform")
    assert isinstance(res.model, KNNModel) and res.model.k == res.hparams["k"]
    assert np.array_equal(res.model.predict(x).numpy(), res.test_pred)
    torch.testing.assert_close(res.model.predict_proba(x).sum(1), torch.ones(len(x)))
