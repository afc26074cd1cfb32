"""The faster training step against plain references: MR2's same-class term in both layouts against a loop over
anchors, the per-head cross-entropy in both forms against F.cross_entropy, the statistics of frozen features
shared by every stack on one TrainData, LfF's per-sample EMA."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import mr2probe.methods.mr2 as mr2_module
from mr2probe.heads import ProbeConfig
from mr2probe.methods._base import LSE_MAX_CLASSES, per_head_ce
from mr2probe.methods.mr2 import rep_margin_loss
from mr2probe.trainer import TrainConfig, TrainData, expand_runs, train_stack


def _naive_rep_loss(z: torch.Tensor, y: torch.Tensor, s_bar: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """(1/A) Σ_x τ·log(1 + Σ₊ exp((‖z − z⁺‖² − 2s̄)/τ)) per head, one anchor at a time."""
    out = []
    for h in range(z.shape[0]):
        terms = []
        for i in range(z.shape[1]):
            partners = [j for j in range(z.shape[1]) if j != i and y[j] == y[i]]
            if partners:
                d2 = ((z[h, i] - z[h, partners]) ** 2).sum(-1)
                terms.append(tau[h] * torch.log1p(torch.exp((d2 - 2 * s_bar[h]) / tau[h]).sum()))
        out.append(torch.stack(terms).mean() if terms else z.new_zeros(()))
    return torch.stack(out)


@pytest.mark.parametrize("layout", ["blocks", "pairs"])
@pytest.mark.parametrize("k, b", [(3, 20), (8, 24), (40, 50)])  # classes of 1 (no partner) to ~7 samples
def test_rep_margin_loss_layouts_match_a_loop_over_anchors(layout: str, k: int, b: int) -> None:
    g = torch.Generator().manual_seed(k)
    z = torch.randn(2, b, 5, generator=g, dtype=torch.float64)
    y = torch.randint(0, k, (b,), generator=g)
    s_bar, tau = torch.tensor([3.0, 5.0], dtype=torch.float64), torch.tensor([2.0, 7.0], dtype=torch.float64)
    za, zb = z.clone().requires_grad_(True), z.clone().requires_grad_(True)
    got = rep_margin_loss(za, y, s_bar, tau, layout=layout)
    want = _naive_rep_loss(zb, y, s_bar, tau)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    weights = torch.tensor([1.0, -2.0], dtype=torch.float64)
    (got * weights).sum().backward()
    (want * weights).sum().backward()
    torch.testing.assert_close(za.grad, zb.grad, rtol=1e-10, atol=1e-12)


def _frozen_data() -> TrainData:
    g = torch.Generator().manual_seed(0)
    y = torch.arange(90) % 3
    x = torch.randn(90, 6, generator=g) * (1 + y[:, None].float()) + 2
    return TrainData(x, y, x[:15], y[:15], 3)


def test_frozen_statistics_are_computed_once_per_data_and_give_the_same_training(monkeypatch) -> None:
    calls = []
    real = mr2_module.class_stats_chunked

    def counting(*args, **kwargs):
        calls.append(args[2:])
        return real(*args, **kwargs)

    monkeypatch.setattr(mr2_module, "class_stats_chunked", counting)
    cfg = TrainConfig(epochs=2, batch_size=16, min_steps=0, lr=(1e-2,), wd=(1e-4,), progress=False,
                      chunk_mib=0.0001)  # tiny chunks: several stacks per seed share the statistics too
    methods = ["mr2", "mr2_sqrt", "ce"]
    data = _frozen_data()
    together = [train_stack(data, expand_runs(methods, [s], cfg), cfg) for s in (0, 1)]
    assert len(calls) == 1  # one (head, stats_on, p) for two seeds, every chunk and every MR2-family method
    for s, trained in zip((0, 1), together):  # the same as each seed trained on features seen for the first time
        alone = train_stack(_frozen_data(), expand_runs(methods, [s], cfg), cfg)
        assert trained.info == alone.info
        for name, t in trained.probe.state_dict().items():
            assert torch.equal(t, alone.probe.state_dict()[name]), name
    assert len(calls) == 3


def test_shared_statistics_are_keyed_by_the_head() -> None:
    # a cosine head with stats_on=classifier measures z/‖z‖: statistics cached for a linear head on the same data must
    # not be reused (with the default stats_on=input both heads measure the features themselves)
    data = _frozen_data()
    base = dict(epochs=1, batch_size=16, min_steps=0, lr=(1e-2,), wd=(1e-4,), progress=False,
                method_grid=False)
    lin = TrainConfig(**base, probe=ProbeConfig(head="linear"))
    cos = TrainConfig(**base, probe=ProbeConfig(head="cosine"), scale=(16.0,),
                      method_params={"mr2": {"stats_on": "classifier"}})
    v_lin = train_stack(data, expand_runs(["mr2"], [0], lin), lin).info[0]["variability"]
    v_cos = train_stack(data, expand_runs(["mr2"], [0], cos), cos).info[0]["variability"]
    v_fresh = train_stack(_frozen_data(), expand_runs(["mr2"], [0], cos), cos).info[0]["variability"]
    assert v_cos == v_fresh
    assert v_cos != v_lin


def test_lff_ema_follows_each_sample_over_its_visits() -> None:
    # ℓ̃ ← CE at the first visit, then a·ℓ̃ + (1 − a)·CE at every later one, per sample (two steps by hand)
    from mr2probe.methods import METHODS, Batch
    from test_methods import make_ctx

    k, n = 3, 6
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    ctx = make_ctx(y.tolist(), k, rep_dim=4, x=torch.zeros(n, 4), val_x=torch.zeros(2, 4), val_y=[0, 1], epochs=1)
    m = METHODS.get("lff")([{**METHODS.get("lff").defaults, "lr": 1e-2, "weight_decay": 0.0}], ctx)
    m.prepare()
    rep = torch.zeros(1, 2, 4)
    first = Batch(torch.zeros(1, 2, k), rep, y[[1, 4]], torch.tensor([1, 4]))
    m.loss(first)
    assert m.ema_d[0, [1, 4]].tolist() == pytest.approx([math.log(3)] * 2)
    assert m.seen.tolist() == [False, True, False, False, True, False]
    logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
    m.loss(Batch(logits, rep, y[[4, 0]], torch.tensor([4, 0])))
    ce = torch.nn.functional.cross_entropy(logits[0], y[[4, 0]], reduction="none")
    a = m.hparams[0]["ema"]
    assert float(m.ema_d[0, 4]) == pytest.approx(a * math.log(3) + (1 - a) * float(ce[0]))
    assert float(m.ema_d[0, 0]) == pytest.approx(float(ce[1]))  # sample 0: its first visit
    assert float(m.ema_d[0, 1]) == pytest.approx(math.log(3))  # not in this batch: unchanged


@pytest.mark.parametrize("k", [3, LSE_MAX_CLASSES, LSE_MAX_CLASSES + 1, 200])
def test_per_head_ce_is_cross_entropy_per_head_in_both_forms(k: int) -> None:
    """ℓ_hb = −log softmax(z_hb)_y_b for every head: values and gradients against F.cross_entropy head by head,
    on both sides of the form switch, and on a hand case: z = (0, ln 3) with y = 1 gives −log ¾."""
    g = torch.Generator().manual_seed(k)
    z = (3 * torch.randn(4, 9, k, generator=g, dtype=torch.float64)).requires_grad_(True)
    y = torch.randint(0, k, (9,), generator=g)
    w = torch.randn(4, 9, generator=g, dtype=torch.float64)
    got = per_head_ce(z, y)
    want = torch.stack([torch.nn.functional.cross_entropy(z[h], y, reduction="none") for h in range(4)])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    (gz,) = torch.autograd.grad((w * got).sum(), z)
    (wz,) = torch.autograd.grad((w * want).sum(), z)
    torch.testing.assert_close(gz, wz, rtol=1e-12, atol=1e-12)
    hand = torch.zeros(1, 1, k, dtype=torch.float64)
    hand[0, 0, 1] = np.log(3.0)  # p_1 = 3 / (3 + (k − 1))
    assert per_head_ce(hand, torch.tensor([1])).item() == pytest.approx(-np.log(3.0 / (k + 2)), rel=1e-12)
