"""MR2 math on hand-computable cases (spec: ../shared/spec/mr2.md)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mr2probe.heads import ProbeConfig, ProbeStack
from mr2probe.methods.mr2 import logit_margin_ce, rep_margin_loss
from mr2probe.stats import class_stats, lp_sq, margins

# 3 classes in 2-D:  class 0: (1,0), (3,0)   class 1: (0,2), (0,2)   class 2: (1,1)
Z = torch.tensor([[1.0, 0], [3, 0], [0, 2], [0, 2], [1, 1]], dtype=torch.float64)
Y = torch.tensor([0, 0, 1, 1, 2])


def test_stats_and_margins_by_hand_p2() -> None:
    st = class_stats(Z, Y, 3, p=2)
    # μ0 = (2,0), ŝ²0 = mean(1, 1) = 1, v0 = 4 + 1 = 5;  μ1 = (0,2), ŝ²1 = 0, v1 = 4;  μ2 = (1,1), v2 = 2
    assert st.mean.tolist() == [[2, 0], [0, 2], [1, 1]]
    np.testing.assert_allclose(st.s2.numpy(), [1, 0, 0], rtol=1e-15, atol=0)  # √ then ² of the norm: 1 ulp
    np.testing.assert_allclose(st.v.numpy(), [5, 4, 2], rtol=1e-15, atol=0)
    # γ_k = 3 · v_k^(1/3) / (5^(1/3) + 4^(1/3) + 2^(1/3)) = 3 · (1.70998, 1.58740, 1.25992) / 4.55730
    gamma = margins(st.v)
    np.testing.assert_allclose(gamma.numpy(), [1.125658, 1.044958, 0.829384], atol=1e-5)
    assert float(gamma.mean()) == pytest.approx(1.0)
    assert float(margins(st.v, c_bar=2.0).mean()) == pytest.approx(2.0)
    # s̄ (L2) = mean(1, 0, 0) = 1/3
    assert float(st.s_bar) == pytest.approx(1 / 3)


def test_stats_p3_by_hand() -> None:
    st = class_stats(Z, Y, 3, p=3)
    # ‖(2,0)‖₃² = 4, ‖(±1,0)‖₃² = 1 → v0 = 5; ‖(0,2)‖₃² = 4 → v1 = 4; ‖(1,1)‖₃² = 2^(2/3) → v2 = 1.5874
    np.testing.assert_allclose(st.v.numpy(), [5, 4, 2 ** (2 / 3)], rtol=1e-12)
    st5 = class_stats(Z, Y, 3, p=5)
    np.testing.assert_allclose(st5.v.numpy()[2], 2 ** (2 / 5), rtol=1e-12)
    assert float(lp_sq(torch.tensor([3.0, 4.0]), 2)) == pytest.approx(25.0)


def test_margin_exponents_for_ablations() -> None:
    v = torch.tensor([1.0, 8.0, 27.0])
    np.testing.assert_allclose(margins(v).numpy(), 3 * np.array([1, 2, 3]) / 6, rtol=1e-6)
    np.testing.assert_allclose(margins(v, exponent=1.0).numpy(), 3 * np.array([1, 8, 27]) / 36, rtol=1e-6)


def test_all_gamma_one_is_cross_entropy() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 16, 5)
    y = torch.randint(0, 5, (16,))
    ours = logit_margin_ce(logits, y, torch.ones(3, 5))
    ref = torch.stack([F.cross_entropy(logits[h], y, reduction="none") for h in range(3)])
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)  # the same loss, in another summation order


def test_logits_divided_by_true_class_margin() -> None:
    logits = torch.tensor([[[2.0, 0.0], [0.0, 4.0]]])  # one head, two samples
    y = torch.tensor([0, 1])
    gamma = torch.tensor([[1.0, 2.0]])
    # sample 0: CE((2, 0) / 1, 0) = log(1 + e^-2);  sample 1: CE((0, 4) / 2, 1) = log(1 + e^-2)
    out = logit_margin_ce(logits, y, gamma)
    np.testing.assert_allclose(out.numpy(), [[math.log(1 + math.exp(-2))] * 2], rtol=1e-6)


@pytest.mark.parametrize("layout", ["blocks", "pairs", "auto"])
def test_rep_loss_equals_pair_loop(layout: str) -> None:
    torch.manual_seed(1)
    z = torch.randn(2, 7, 3, dtype=torch.float64)
    y = torch.tensor([0, 1, 0, 2, 1, 0, 3])  # class 2 and 3 have a single sample: not anchors
    s_bar = torch.tensor([0.7, 1.3], dtype=torch.float64)
    tau = torch.tensor([1.0, 30.0], dtype=torch.float64)
    got = rep_margin_loss(z, y, s_bar, tau, layout=layout)
    for h in range(2):
        per_anchor = []
        for i in range(7):
            terms = [math.exp((float(((z[h, i] - z[h, j]) ** 2).sum()) - 2 * float(s_bar[h])) / float(tau[h]))
                     for j in range(7) if j != i and y[j] == y[i]]
            if terms:
                per_anchor.append(float(tau[h]) * math.log(1 + sum(terms)))
        assert float(got[h]) == pytest.approx(sum(per_anchor) / len(per_anchor), rel=1e-10)


@pytest.mark.parametrize("k", [3, 40, 400])  # few classes (blocks win), many classes (pairs win)
def test_rep_loss_layouts_agree_with_gradients(k: int) -> None:
    torch.manual_seed(k)
    y = torch.randint(0, k, (128,))
    s_bar, tau = torch.tensor([5.0, 9.0], dtype=torch.float64), torch.tensor([4.0, 80.0], dtype=torch.float64)
    out = {}
    for layout in ("blocks", "pairs"):
        z = torch.randn(2, 128, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True)
        loss = rep_margin_loss(z, y, s_bar, tau, layout=layout)
        out[layout] = (loss.detach(), torch.autograd.grad(loss.sum(), z)[0])
    torch.testing.assert_close(out["blocks"][0], out["pairs"][0], rtol=1e-12, atol=0)
    torch.testing.assert_close(out["blocks"][1], out["pairs"][1], rtol=1e-10, atol=1e-14)


def test_block_layout_closed_form_gradient_passes_gradcheck() -> None:
    """The block layout's hand-written backward (one Gram product) against finite differences, in float64, with a
    class of one (no partner), uneven class sizes and two heads with their own τ."""
    y = torch.tensor([0, 1, 0, 2, 1, 0, 3, 2, 0])
    z = torch.randn(2, 9, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3), requires_grad=True)
    s_bar, tau = torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([3.0, 7.0], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda t: rep_margin_loss(t, y, s_bar, tau, layout="blocks"), (z,))


def test_rep_loss_unknown_layout_is_refused() -> None:
    with pytest.raises(ValueError, match="layout"):
        rep_margin_loss(torch.zeros(1, 2, 3), torch.tensor([0, 0]), torch.ones(1), torch.ones(1), layout="diagonal")


@pytest.mark.parametrize("reference", [False, True])
def test_dense_layout_matches_blocks_and_pairs(reference: bool) -> None:
    """The dense layout (one masked B×B matrix, no host sync) gives the blocks and pairs layouts' value and gradient,
    in float64, with a class of one and uneven class sizes."""
    y = torch.tensor([0, 1, 0, 2, 1, 0, 3, 2, 0])
    z0 = torch.randn(2, 9, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    s_bar, tau = torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([3.0, 7.0], dtype=torch.float64)
    out = {}
    for layout in ("dense", "blocks", "pairs"):
        z = z0.clone().requires_grad_(True)
        loss = rep_margin_loss(z, y, s_bar, tau, layout=layout, reference=reference, num_classes=4)
        loss.sum().backward()
        out[layout] = (loss.detach(), z.grad)
    for layout in ("blocks", "pairs"):
        torch.testing.assert_close(out["dense"][0], out[layout][0], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(out["dense"][1], out[layout][1], rtol=1e-10, atol=1e-12)


def test_rep_loss_without_any_pair_is_zero() -> None:
    z = torch.randn(2, 4, 3, requires_grad=True)
    out = rep_margin_loss(z, torch.arange(4), torch.ones(2), torch.ones(2))
    assert out.tolist() == [0.0, 0.0]


def test_rep_loss_small_tau_is_hinge() -> None:
    z = torch.tensor([[[0.0], [3.0], [10.0]]])
    y = torch.tensor([0, 0, 1])
    out = rep_margin_loss(z, y, torch.tensor([2.0]), torch.tensor([1e-3]))
    # both anchors of class 0: max(0, 9 − 4) = 5
    assert float(out[0]) == pytest.approx(5.0, rel=1e-3)


def _setup(adapter: str, head: str = "linear", epochs: int = 1):
    from mr2probe.trainer import TrainConfig, TrainData

    torch.manual_seed(0)
    x = torch.randn(60, 6)
    y = torch.arange(60) % 3
    data = TrainData(x, y, x[:12], y[:12], 3)
    cfg = TrainConfig(epochs=epochs, batch_size=20, lr=(1e-2,), wd=(0.0,), min_steps=0,
                      method_grid=False, probe=ProbeConfig(head=head, adapter=adapter, width=4), progress=False)
    return data, cfg


def test_gradients_reach_adapter_and_head_only() -> None:
    from mr2probe.trainer import expand_runs, train_stack

    data, cfg = _setup("linear")
    trained = train_stack(data, expand_runs(["ce", "mr2"], [0], cfg), cfg)
    probe, x = trained.probe, data.x.clone()
    h = [i for i, s in enumerate(trained.specs) if s.method == "mr2"][0]
    gamma = torch.tensor(trained.info[h]["margins"])
    s_bar = torch.tensor([trained.info[h]["s_bar"]])
    probe.zero_grad(set_to_none=True)
    rep, logits = probe(x)
    loss = logit_margin_ce(logits[h:h + 1], data.y, gamma[None]).mean() \
        + 0.1 * rep_margin_loss(rep[h:h + 1], data.y, s_bar, torch.tensor([40.0])).sum()
    loss.backward()
    others = [i for i in range(len(trained.specs)) if i != h]
    names = {n for n, _ in probe.named_parameters()}
    assert {"adapter_A", "adapter_a", "head_W", "head_b"} <= names
    for name, p in probe.named_parameters():
        assert p.grad[h].abs().sum() > 0, f"{name}: no gradient for the head's own parameters"
        assert p.grad[others].abs().sum() == 0, f"{name}: gradient leaked into another head"
    assert x.grad is None and torch.equal(x, data.x)  # frozen features: no gradient, unchanged
    assert not gamma.requires_grad


def test_stats_recomputed_exactly_at_epoch_start_with_adapter() -> None:
    from mr2probe.trainer import expand_runs, train_stack

    data, cfg = _setup("linear", head="cosine", epochs=1)
    specs = expand_runs(["mr2"], [0], cfg)
    trained = train_stack(data, specs, cfg)
    # one epoch: the statistics are those of the adapter at initialisation, which the seed fixes, on its output g(x)
    # (stats_on=input, the default; z/‖z‖ would be what the cosine head sees)
    fresh = ProbeStack(cfg.probe, 6, 3, [0])
    with torch.no_grad():
        direct = class_stats(fresh.adapter_output(data.x), data.y, 3, p=3)
    np.testing.assert_allclose(trained.info[0]["variability"], direct.v[0].numpy(), rtol=1e-5)
    np.testing.assert_allclose(trained.info[0]["s_bar"], float(direct.s_bar[0]), rtol=1e-5)


def test_stats_once_for_frozen_features_match_direct_computation() -> None:
    from mr2probe.trainer import expand_runs, train_stack

    data, cfg = _setup("none", head="cosine")
    trained = train_stack(data, expand_runs(["mr2"], [0], cfg), cfg)
    direct = class_stats(data.x, data.y, 3, p=3)  # stats_on=input (default): the features, not z/‖z‖
    np.testing.assert_allclose(trained.info[0]["variability"], direct.v.numpy(), rtol=1e-5)
    np.testing.assert_allclose(trained.info[0]["margins"], margins(direct.v).numpy(), rtol=1e-5)
