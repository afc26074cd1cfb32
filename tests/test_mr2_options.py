"""MR2 options with the authors' code's choices (spec ../shared/spec/mr2.md): ``rep_scale`` and ``stats_on``.

Each option is checked against a direct computation of its formula: hand-written loops over classes and anchors,
statistics of the raw or the normalised features computed outside the method.
"""
from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from mr2probe.errors import UserError
from mr2probe.heads import ProbeConfig, ProbeStack
from mr2probe.methods import METHODS, Batch
from mr2probe.methods.mr2 import MR2, logit_margin_ce, rep_margin_loss
from mr2probe.stats import class_stats
from mr2probe.trainer import RunSpec, TrainConfig, TrainData, expand_runs, method_hparams, train_stack


def reference_loop(z: torch.Tensor, y: torch.Tensor, s_bar: float, k: int) -> float:
    """The authors' code's term, literally: per class with ≥ 2 samples, the mean over its anchors of
    log(1 + Σ_{j≠i, same class} exp((‖z_i − z_j‖² − 2s̄)/(10·D))); summed over classes; times D/10/K."""
    d = z.shape[1]
    total = 0.0
    for c in sorted(set(y.tolist())):
        members = [i for i in range(len(y)) if int(y[i]) == c]
        if len(members) < 2:
            continue
        per_anchor = [math.log1p(sum(math.exp((float(((z[i] - z[j]) ** 2).sum()) - 2 * s_bar) / (10 * d))
                                     for j in members if j != i)) for i in members]
        total += sum(per_anchor) / len(per_anchor)
    return total * d / 10 / k


def mr2probe_loop(z: torch.Tensor, y: torch.Tensor, s_bar: float, tau: float) -> float:
    """Today's form: mean over anchors of τ·log(1 + Σ exp((‖z_i − z_j‖² − 2s̄)/τ))."""
    vals = []
    for i in range(len(y)):
        terms = [math.exp((float(((z[i] - z[j]) ** 2).sum()) - 2 * s_bar) / tau)
                 for j in range(len(y)) if j != i and y[j] == y[i]]
        if terms:
            vals.append(tau * math.log1p(sum(terms)))
    return sum(vals) / len(vals)


# ---- rep_scale -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["blocks", "pairs", "auto"])
def test_reference_scale_equals_loop_over_classes(layout: str) -> None:
    torch.manual_seed(3)
    k, d = 6, 5
    z = torch.randn(2, 11, d, dtype=torch.float64)
    y = torch.tensor([0, 1, 0, 2, 1, 0, 3, 1, 1, 4, 4])  # classes 2, 3 single (not anchors); class 5 absent
    s_bar = torch.tensor([0.4, 1.7], dtype=torch.float64)
    tau = torch.full((2,), 10.0 * d, dtype=torch.float64)
    got = rep_margin_loss(z, y, s_bar, tau, layout=layout, reference=True, num_classes=k)
    for h in range(2):
        assert float(got[h]) == pytest.approx(reference_loop(z[h], y, float(s_bar[h]), k), rel=1e-10)


def test_rep_scale_per_head_and_default_unchanged() -> None:
    torch.manual_seed(4)
    z = torch.randn(2, 9, 3, dtype=torch.float64)
    y = torch.tensor([0, 0, 1, 1, 1, 2, 2, 2, 2])
    s_bar, tau = torch.tensor([0.5, 0.9], dtype=torch.float64), torch.full((2,), 30.0, dtype=torch.float64)
    mixed = rep_margin_loss(z, y, s_bar, tau, reference=torch.tensor([True, False]), num_classes=3)
    assert float(mixed[0]) == pytest.approx(reference_loop(z[0], y, 0.5, 3), rel=1e-10)
    assert float(mixed[1]) == pytest.approx(mr2probe_loop(z[1], y, 0.9, 30.0), rel=1e-10)
    assert torch.equal(rep_margin_loss(z, y, s_bar, tau), rep_margin_loss(z, y, s_bar, tau, reference=False))


@pytest.mark.parametrize("tau", [15.0, 3.0])  # 15 = 10·d (the reference's value), and another τ
def test_scale_ratio_is_100_k_over_c(tau: float) -> None:
    # K = 5 classes; in the batch C = 3 classes with 2 samples each and one singleton: every anchor weighs the
    # same in both forms, so mr2probe / reference = 100·K/C exactly
    torch.manual_seed(5)
    z = torch.randn(1, 7, 3, dtype=torch.float64)
    y = torch.tensor([0, 0, 2, 2, 3, 3, 4])
    s_bar, t = torch.tensor([0.3], dtype=torch.float64), torch.tensor([tau], dtype=torch.float64)
    ours = rep_margin_loss(z, y, s_bar, t)
    theirs = rep_margin_loss(z, y, s_bar, t, reference=True, num_classes=5)
    assert float(ours / theirs) == pytest.approx(100 * 5 / 3, rel=1e-12)


def test_reference_layouts_agree_with_gradients() -> None:
    y = torch.randint(0, 40, (128,), generator=torch.Generator().manual_seed(0))
    s_bar, tau = torch.tensor([5.0, 9.0], dtype=torch.float64), torch.tensor([80.0, 80.0], dtype=torch.float64)
    out = {}
    for layout in ("blocks", "pairs"):
        z = torch.randn(2, 128, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
        loss = rep_margin_loss(z, y, s_bar, tau, layout=layout, reference=True, num_classes=40)
        out[layout] = (loss.detach(), torch.autograd.grad(loss.sum(), z)[0])
    torch.testing.assert_close(out["blocks"][0], out["pairs"][0], rtol=1e-12, atol=0)
    torch.testing.assert_close(out["blocks"][1], out["pairs"][1], rtol=1e-10, atol=1e-14)


def test_reference_scale_needs_num_classes() -> None:
    with pytest.raises(ValueError, match="num_classes"):
        rep_margin_loss(torch.zeros(1, 2, 3), torch.tensor([0, 0]), torch.ones(1), torch.ones(1), reference=True)


# ---- hyperparameters: checks, ablations, λ grid ----------------------------------------------------------

def _cfg(**kw: Any) -> TrainConfig:
    """A small config; a one-step floor and a single cosine scale where the trainer has those settings."""
    extra = {k: v for k, v in {"min_steps": 0, "scale": (16.0,)}.items() if k in TrainConfig.__dataclass_fields__}
    return TrainConfig(**{"batch_size": 20, "lr": (1e-2,), "wd": (0.0,), "progress": False, **extra, **kw})


@pytest.mark.parametrize("name", ["mr2", "mr2_uniform", "mr2_no_rep", "mr2_sqrt", "mr2_linear"])
@pytest.mark.parametrize("key,bad", [("stats_on", "foo"), ("rep_scale", "paper")])
def test_bad_option_values_are_refused(name: str, key: str, bad: str) -> None:
    with pytest.raises(UserError, match=key) as e:
        method_hparams(name, _cfg(method_params={name: {key: bad}}))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["mr2", "mr2_uniform", "mr2_no_rep", "mr2_sqrt", "mr2_linear"])
def test_options_available_to_every_ablation(name: str) -> None:
    cls = METHODS.get(name)
    assert cls.defaults["rep_scale"] == "mr2probe" and cls.defaults["stats_on"] == "input"
    points = method_hparams(name, _cfg(method_params={name: {"rep_scale": "reference", "stats_on": "classifier"}},
                                       method_grid=False))
    assert all(p["rep_scale"] == "reference" and p["stats_on"] == "classifier" for p in points)


def test_adapter_lam_grid_spans_both_scales() -> None:
    lams = MR2.adapter_grid["lam"]
    # both forms' default (0.1), and mr2probe's 0.1 in the reference form: × 100·K/C = 100 when C = K
    assert 0.1 in lams and any(math.isclose(v, 0.1 * 100) for v in lams) and min(lams) <= 0.01
    assert "lam" not in MR2.grid  # without a trainable adapter λ has no effect: not searched
    for name in ["mr2_uniform", "mr2_sqrt", "mr2_linear"]:
        assert METHODS.get(name).adapter_grid == MR2.adapter_grid
    assert METHODS.get("mr2_no_rep").adapter_grid == {}  # λ = 0 is that ablation


# ---- stats_on ---------------------------------------------------------------------------------------------

def _data(dtype: torch.dtype = torch.float32) -> TrainData:
    g = torch.Generator().manual_seed(0)
    y = torch.arange(60) % 3
    x = torch.randn(60, 6, generator=g, dtype=dtype) * (1 + y[:, None].to(dtype)) + 2  # norms differ by class
    return TrainData(x, y, x[:12], y[:12], 3)


def _specs(cfg: TrainConfig, method: str, variants: list[dict[str, Any]]) -> list[RunSpec]:
    base = method_hparams(method, cfg)[0]
    return [RunSpec(method, tuple(sorted({**base, **v}.items())), 0) for v in variants]


@pytest.mark.parametrize("p", [2.0, 3.0, 5.0])
def test_stats_on_frozen_cosine_raw_vs_normalised(p: float) -> None:
    data = _data()
    cfg = _cfg(epochs=1, method_grid=False, probe=ProbeConfig(head="cosine"))
    trained = train_stack(data, _specs(cfg, "mr2", [{"stats_on": "input", "p": p},
                                                    {"stats_on": "classifier", "p": p}]), cfg)
    raw, unit = class_stats(data.x, data.y, 3, p), class_stats(F.normalize(data.x, dim=-1), data.y, 3, p)
    by_space = {dict(s.hparams)["stats_on"]: info for s, info in zip(trained.specs, trained.info)}
    for space, st in (("input", raw), ("classifier", unit)):
        torch.testing.assert_close(torch.tensor(by_space[space]["variability"]), st.v, rtol=1e-5, atol=0)
        assert by_space[space]["s_bar"] == pytest.approx(float(st.s_bar), rel=1e-5)
    assert not torch.allclose(raw.v, unit.v)


def test_shared_stats_cache_keyed_by_stats_on_and_p() -> None:
    # three MR2-family slices of one frozen stack share the statistics cache: each must get its own (space, p)
    data = _data()
    params = {"mr2": {"stats_on": "classifier"}, "mr2_sqrt": {"stats_on": "input"},
              "mr2_linear": {"stats_on": "input", "p": 5.0}}
    cfg = _cfg(epochs=1, method_grid=False, probe=ProbeConfig(head="cosine"), method_params=params)
    trained = train_stack(data, expand_runs(list(params), [0], cfg), cfg)
    want = {"mr2": class_stats(F.normalize(data.x, dim=-1), data.y, 3, 3.0),
            "mr2_sqrt": class_stats(data.x, data.y, 3, 3.0), "mr2_linear": class_stats(data.x, data.y, 3, 5.0)}
    for spec, info in zip(trained.specs, trained.info):
        torch.testing.assert_close(torch.tensor(info["variability"]), want[spec.method].v, rtol=1e-5, atol=0)


def test_stats_on_is_moot_for_a_linear_head() -> None:
    data = _data()
    cfg = _cfg(epochs=1, method_grid=False, probe=ProbeConfig(head="linear"))
    trained = train_stack(data, _specs(cfg, "mr2", [{"stats_on": "input"}, {"stats_on": "classifier"}]), cfg)
    assert trained.info[0] == trained.info[1]
    torch.testing.assert_close(torch.tensor(trained.info[0]["variability"]), class_stats(data.x, data.y, 3).v,
                               rtol=1e-5, atol=0)


def test_stats_on_with_adapter_at_epoch_start() -> None:
    # one epoch: the statistics are those of the adapter at initialisation (fixed by the seed)
    data = _data()
    cfg = _cfg(epochs=1, method_grid=False, probe=ProbeConfig(head="cosine", adapter="linear", width=4))
    trained = train_stack(data, _specs(cfg, "mr2", [{"stats_on": "input"}, {"stats_on": "classifier"}]), cfg)
    fresh = ProbeStack(cfg.probe, 6, 3, [0])
    with torch.no_grad():
        g = fresh.adapter_output(data.x)
        want = {"input": class_stats(g, data.y, 3), "classifier": class_stats(F.normalize(g, dim=-1), data.y, 3)}
    for spec, info in zip(trained.specs, trained.info):
        st = want[dict(spec.hparams)["stats_on"]]
        torch.testing.assert_close(torch.tensor(info["variability"]), st.v[0], rtol=1e-5, atol=0)
        assert info["s_bar"] == pytest.approx(float(st.s_bar[0]), rel=1e-5)


def test_reference_choices_loss_uses_unnormalised_representation(monkeypatch: pytest.MonkeyPatch) -> None:
    """stats_on=input + rep_scale=reference through the trainer: the method's loss on the whole training set equals
    CE(f/γ_y) + λ · (the reference loop on g(x), not on g(x)/‖g(x)‖), in value and in gradient."""
    seen: list[MR2] = []
    prepare = MR2.prepare
    monkeypatch.setattr(MR2, "prepare", lambda self: (seen.append(self), prepare(self))[1])
    data = _data(torch.float64)
    cfg = _cfg(epochs=1, batch_size=30, method_grid=False,
               probe=ProbeConfig(head="cosine", adapter="linear", width=4),
               method_params={"mr2": {"stats_on": "input", "rep_scale": "reference", "lam": 10.0}})
    trained = train_stack(data, expand_runs(["mr2"], [0], cfg), cfg)
    (m,), probe, x, y = seen, trained.probe, data.x, data.y
    assert m.h == 1 and bool(m.on_input[0]) and bool(m.reference[0])

    rep, logits = probe(x)
    got = m.loss(Batch(logits, rep, y, torch.arange(len(y))))[0]
    g = probe.adapter_output(x)[0]
    s_bar, gamma = float(m.s_bar[0]), m.gamma
    want = logit_margin_ce(logits, y, gamma).mean() + 10.0 * reference_loop(g.detach(), y, s_bar, 3)
    assert float(got.detach()) == pytest.approx(float(want.detach()), rel=1e-10)
    on_unit = reference_loop(F.normalize(g, dim=-1).detach(), y, s_bar, 3)
    assert abs(on_unit - reference_loop(g.detach(), y, s_bar, 3)) > 1e-3  # the choice matters here

    # gradient on the adapter: same as the direct (vectorised) formula on g(x)
    direct = logit_margin_ce(logits, y, gamma).mean() + 10.0 * rep_margin_loss(
        g[None], y, m.s_bar, torch.tensor([40.0], dtype=torch.float64), reference=True, num_classes=3)[0]
    assert float(direct.detach()) == pytest.approx(float(want.detach()), rel=1e-10)
    ga = torch.autograd.grad(got, probe.adapter_A, retain_graph=True)[0]
    gb = torch.autograd.grad(direct, probe.adapter_A)[0]
    torch.testing.assert_close(ga, gb, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("space", ["input", "classifier"])
def test_ema_updates_from_the_chosen_space(space: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """stats=ema with ema_decay=0: after one loss call the statistics are those of that batch, in ``stats_on``."""
    seen: list[MR2] = []
    prepare = MR2.prepare
    monkeypatch.setattr(MR2, "prepare", lambda self: (seen.append(self), prepare(self))[1])
    data = _data(torch.float64)
    cfg = _cfg(epochs=1, method_grid=False, probe=ProbeConfig(head="cosine", adapter="linear", width=4),
               method_params={"mr2": {"stats_on": space, "stats": "ema", "ema_decay": 0.0, "p": 5.0}})
    trained = train_stack(data, expand_runs(["mr2"], [0], cfg), cfg)
    (m,), probe = seen, trained.probe
    rep, logits = probe(data.x)
    m.loss(Batch(logits, rep, data.y, torch.arange(len(data.y))))
    with torch.no_grad():
        g = probe.adapter_output(data.x)
        st = class_stats(g if space == "input" else F.normalize(g, dim=-1), data.y, 3, 5.0)
    torch.testing.assert_close(m.v[0], st.v[0], rtol=1e-10, atol=0)
    assert float(m.s_bar[0]) == pytest.approx(float(st.s_bar[0]), rel=1e-10)


def test_ema_updates_every_class_present_at_k_100(monkeypatch: pytest.MonkeyPatch) -> None:
    """stats=ema at K = 100 with batches of 64 (no batch holds every class): each step moves the statistics of the
    classes in its batch — a class's first batch sets them, a later one moves them by the decay — and leaves the
    others as they were."""
    seen: list[MR2] = []
    prepare = MR2.prepare
    monkeypatch.setattr(MR2, "prepare", lambda self: (seen.append(self), prepare(self))[1])
    g = torch.Generator().manual_seed(0)
    k, n = 100, 400
    y = torch.arange(n) % k
    x = torch.randn(n, 6, generator=g, dtype=torch.float64) + y[:, None].to(torch.float64) / 10
    data = TrainData(x, y, x[:k], y[:k], k)
    cfg = _cfg(epochs=1, batch_size=64, method_grid=False, probe=ProbeConfig(adapter="linear", width=4),
               method_params={"mr2": {"stats": "ema", "ema_decay": 0.5, "p": 3.0}})
    trained = train_stack(data, expand_runs(["mr2"], [0], cfg), cfg)
    (m,), probe = seen, trained.probe
    assert bool(m.seen.all())  # training visited every class
    m.seen[:32] = False  # as if classes 0…31 had had no batch yet: this step's batch is their first
    before, seen_before = m.v.clone(), m.seen.clone()
    idx = torch.arange(64)  # classes 0…63: some seen in training already, the batch misses 36 classes
    rep, logits = probe(x[idx])
    m.loss(Batch(logits, rep, y[idx], idx))
    with torch.no_grad():  # one sample per class in this batch: ŝ² = 0, v̂_k = ‖z_k‖_3²
        v_batch = torch.linalg.vector_norm(probe.represent(x[idx])[0], 3, dim=-1).square()
    present = torch.zeros(k, dtype=torch.bool)
    present[y[idx]] = True
    assert torch.equal(m.v[0, ~present], before[0, ~present])  # absent classes keep theirs
    want = torch.where(seen_before[:64], 0.5 * before[0, :64] + 0.5 * v_batch, v_batch)  # first batch: set
    torch.testing.assert_close(m.v[0, :64], want, rtol=1e-12, atol=1e-14)
    assert bool(m.seen[present].all()) and torch.equal(m.seen[~present], seen_before[~present])
