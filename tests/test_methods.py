"""The baselines and MR2 ablations (spec: ../shared/spec/baselines.md) on hand-computable cases.

References are computed element by element in plain Python (math), never with the code under test.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Callable

import pytest
import torch

from mr2probe.errors import UserError
from mr2probe.heads import HeadSet, ProbeConfig
from mr2probe.methods import METHODS, Batch, FitContext, FitData, FitSchedule, HeadsView, Method
from mr2probe.methods.mr2 import MR2
from mr2probe.stats import class_stats, margins
from mr2probe.trainer import RunSpec, TrainConfig, TrainData, method_hparams, train_stack

from conftest import run_cli

METHOD_NAMES = METHODS.names()  # every registered method (the baselines, MR2 and its ablations), from the registry

# Two samples, three classes, explicit logits.
LOGITS = [[2.0, 0.5, -1.0], [0.0, 1.0, 3.0]]
Y = [0, 1]
# An imbalanced training set: n = (16, 4, 1).
Y_TRAIN_IMB = [0] * 16 + [1] * 4 + [2]
Y_TRAIN_BAL = [0, 1, 2] * 4


def lse(v: list[float]) -> float:
    m = max(v)
    return m + math.log(sum(math.exp(a - m) for a in v))


def ce(v: list[float], y: int) -> float:
    return lse(v) - v[y]


def sigmoid(a: float) -> float:
    return 1 / (1 + math.exp(-a))


@dataclass(frozen=True)
class StubAux:
    """The trainer's auxiliary capability for a context built by hand: ``train`` answers with ``stage1(method,
    hparams, epochs)`` (none given: a test that expects no auxiliary stage fails), ``new_heads`` gives fresh heads
    as the trainer does (:meth:`~mr2probe.heads.HeadSet.fresh`)."""

    probe: ProbeConfig
    num_classes: int
    rep_dim: int
    dtype: torch.dtype
    stage1: Callable | None = None

    def train(self, method: str, hparams: list[dict[str, Any]], epochs: int) -> torch.Tensor:
        assert self.stage1 is not None, "no auxiliary stage expected"
        return self.stage1(method, hparams, epochs)

    def new_heads(self, seeds: list[int], scales: list[float]) -> HeadSet:
        return HeadSet.fresh(self.probe, seeds, self.num_classes, self.rep_dim, scales, torch.device("cpu"),
                             self.dtype)


def make_ctx(y_train: list[int], k: int = 3, *, probe: ProbeConfig | None = None, rep_dim: int = 2,
             val_y: list[int] | None = None, predict: Callable | None = None, train_aux: Callable | None = None,
             epochs: int = 3, seed: int = 0, x: torch.Tensor | None = None, val_x: torch.Tensor | None = None,
             represent_train: Callable | None = None) -> FitContext:
    """A context by hand on the CPU: features zeros [N, rep_dim] (float64) unless ``x`` is given."""
    y = torch.tensor(y_train)
    vy = torch.tensor(val_y if val_y is not None else list(range(k)))
    probe = probe or ProbeConfig()
    data = FitData(x=torch.zeros(len(y), rep_dim, dtype=torch.float64) if x is None else x, y=y,
                   val_x=torch.zeros(len(vy), rep_dim, dtype=torch.float64) if val_x is None else val_x, val_y=vy,
                   num_classes=k)
    heads = HeadsView(config=probe, rep_dim=rep_dim, represent_train=represent_train or (lambda: iter([])),
                      predict=predict or (lambda x: None))
    return FitContext(data=data, heads=heads, schedule=FitSchedule(epochs=epochs, batch_size=8, seed=seed),
                      aux=StubAux(probe, k, rep_dim, data.dtype, train_aux))


def build(name: str, ctx: FitContext, *overrides: dict[str, Any]) -> Method:
    """A prepared instance of ``name`` with one head per ``overrides`` dict (default: one head, defaults)."""
    cls = METHODS.get(name)
    hps = [{**cls.defaults, "lr": 1e-2, "weight_decay": 0.0, **o} for o in (overrides or ({},))]
    m = cls(hps, ctx)
    m.prepare()
    return m


def batch(logits: list[list[float]] = LOGITS, y: list[int] = Y, h: int = 1, rep: torch.Tensor | None = None,
          idx: list[int] | None = None) -> Batch:
    t = torch.tensor(logits, dtype=torch.float64).expand(h, -1, -1)
    return Batch(logits=t, rep=rep if rep is not None else torch.zeros(1, len(y), 2, dtype=torch.float64),
                 y=torch.tensor(y), idx=torch.tensor(idx if idx is not None else list(range(len(y)))))


def approx(values: torch.Tensor | list[float], expected: list[float], rel: float = 1e-9) -> None:
    got = values.tolist() if isinstance(values, torch.Tensor) else values
    assert got == pytest.approx(expected, rel=rel, abs=1e-12)


def test_every_method_is_registered_with_documented_defaults() -> None:
    assert "mr2" in METHOD_NAMES
    for name in METHOD_NAMES:
        cls = METHODS.get(name)
        assert issubclass(cls, Method) and cls.name == name
        assert cls.__doc__ and len(cls.__doc__.strip()) > 20, name
        for key, values in cls.grid.items():
            assert key in cls.defaults and 1 <= len(values) <= 2, (name, key)
        assert len(cls.grid) <= 1, name


# ---- per-method closed forms on the two-sample case -------------------------------------------------------

def test_focal_by_hand() -> None:
    m = build("focal", make_ctx(Y_TRAIN_BAL), {"gamma": 2.0}, {"gamma": 0.0})
    ref = [sum((1 - math.exp(-ce(v, y))) ** g * ce(v, y) for v, y in zip(LOGITS, Y)) / 2 for g in (2.0, 0.0)]
    approx(m.loss(batch(h=2)), ref)


def test_label_smoothing_by_hand() -> None:
    m = build("label_smoothing", make_ctx(Y_TRAIN_BAL), {"eps": 0.1}, {"eps": 0.0})
    ref = []
    for eps in (0.1, 0.0):
        per = []
        for v, y in zip(LOGITS, Y):
            q = [(1 - eps) * (k == y) + eps / 3 for k in range(3)]
            per.append(sum(-q[k] * (v[k] - lse(v)) for k in range(3)))
        ref.append(sum(per) / 2)
    approx(m.loss(batch(h=2)), ref)


def test_ldam_margins_and_loss_linear_head() -> None:
    m = build("ldam", make_ctx(Y_TRAIN_IMB), {"max_m": 0.5}, {"max_m": 1.0})
    # n = (16, 4, 1): n^(-1/4) = (1/2, 1/√2, 1) → Δ = max_m · (1/2, 1/√2, 1)
    delta = [0.25, 0.5 / math.sqrt(2), 0.5]
    approx(m.delta[0], delta)
    approx(m.delta[1], [2 * d for d in delta])
    ref = []
    for d in (delta, [2 * x for x in delta]):
        per = [ce([v[k] - d[y] * (k == y) for k in range(3)], y) for v, y in zip(LOGITS, Y)]
        ref.append(sum(per) / 2)
    approx(m.loss(batch(h=2)), ref)


def test_ldam_cosine_head_uses_normalised_logits_and_s() -> None:
    probe = ProbeConfig(head="cosine", scale=16.0)
    m = build("ldam", make_ctx(Y_TRAIN_IMB, probe=probe))
    delta = [0.25, 0.5 / math.sqrt(2), 0.5]
    per = [ce([30 * (v[k] / 16 - delta[y] * (k == y)) for k in range(3)], y) for v, y in zip(LOGITS, Y)]
    approx(m.loss(batch()), [sum(per) / 2])


def test_logit_adjust_and_balanced_softmax_by_hand() -> None:
    pi = [16 / 21, 4 / 21, 1 / 21]
    m = build("logit_adjust", make_ctx(Y_TRAIN_IMB), {"tau": 1.0}, {"tau": 0.5})
    ref = [sum(ce([v[k] + t * math.log(pi[k]) for k in range(3)], y) for v, y in zip(LOGITS, Y)) / 2
           for t in (1.0, 0.5)]
    approx(m.loss(batch(h=2)), ref)
    b = build("balanced_softmax", make_ctx(Y_TRAIN_IMB))
    n = [16, 4, 1]
    approx(b.loss(batch()), [sum(ce([v[k] + math.log(n[k]) for k in range(3)], y) for v, y in zip(LOGITS, Y)) / 2])
    approx(b.loss(batch()), ref[:1])  # same as τ = 1: log n = log π + log N


def test_class_balanced_by_hand() -> None:
    m = build("class_balanced", make_ctx(Y_TRAIN_IMB), {"beta": 0.9})
    raw = [(1 - 0.9) / (1 - 0.9 ** n) for n in (16, 4, 1)]
    w = [3 * r / sum(raw) for r in raw]
    approx(m.weights[0], w, rel=1e-12)
    approx(m.loss(batch()), [sum(w[y] * ce(v, y) for v, y in zip(LOGITS, Y)) / 2])


def test_eql_drops_negative_terms_of_rare_classes() -> None:
    # π = (16, 4, 1)/21; λ = 0.5/3 = 1/6: class 2 (π = 0.048) is rare, class 1 (π = 0.19) is not.
    m = build("eql", make_ctx(Y_TRAIN_IMB))
    assert m.rare[0].tolist() == [False, False, True]
    per = []
    for v, y in zip(LOGITS, Y):
        terms = [-math.log(sigmoid(v[k])) if k == y else (0.0 if k == 2 else -math.log(1 - sigmoid(v[k])))
                 for k in range(3)]
        per.append(sum(terms))
    approx(m.loss(batch()), [sum(per) / 2])


def logits_with_acc() -> tuple[list[int], torch.Tensor]:
    """Labels (0,0,1,1,2,2) and one head's logits that are right on 2/2, 1/2, 0/2 of them."""
    y = [0, 0, 1, 1, 2, 2]
    pred = [0, 0, 1, 0, 0, 1]
    return y, torch.nn.functional.one_hot(torch.tensor(pred), 3).to(torch.float64)[None]


def test_cdb_weights_from_class_accuracy() -> None:
    """Measured on the training rows (``acc_on=train``; the default held-out part is in test_baselines_paper)."""
    y, logits = logits_with_acc()
    state = {"logits": logits}
    ctx = make_ctx(y, predict=lambda x: state["logits"].expand(2, -1, -1))
    m = build("cdb", ctx, {"tau": 1.0, "dynamic_tau": False, "acc_on": "train"},
              {"tau": 2.0, "dynamic_tau": False, "acc_on": "train"})
    m.on_epoch_start(0)
    approx(m.weights[0], [1.0, 1.0, 1.0])  # the paper's first epoch: uniform difficulty
    m.on_epoch_start(1)
    # acc = (1, 0.5, 0) → d = (0.01 floor, 0.5, 1); w = d^τ / mean(d^τ)
    for i, tau in enumerate((1.0, 2.0)):
        d = [0.01 ** tau, 0.5 ** tau, 1.0]
        approx(m.weights[i], [x * 3 / sum(d) for d in [d] for x in d])
    w = m.weights[0].tolist()
    assert w[2] > w[1] > w[0]  # lower accuracy → larger weight
    approx(m.loss(batch(h=2))[:1], [sum(w[y] * ce(v, y) for v, y in zip(LOGITS, Y)) / 2])
    # Recomputed at every epoch from the current predictions: now all right → equal weights.
    state["logits"] = torch.nn.functional.one_hot(torch.tensor(y), 3).to(torch.float64)[None]
    m.on_epoch_start(2)
    approx(m.weights[0], [1.0, 1.0, 1.0])


def test_group_dro_moves_q_toward_the_worse_class() -> None:
    m = build("group_dro", make_ctx(Y_TRAIN_BAL), {"eta": 0.5})
    l0, l1 = ce(LOGITS[0], 0), ce(LOGITS[1], 1)
    assert l1 > l0
    loss = m.loss(batch())
    # q_k ∝ (1/3)·exp(η ℓ_k) for the present classes 0, 1; class 2 is absent and keeps 1/3 before normalising.
    raw = [math.exp(0.5 * l0), math.exp(0.5 * l1), 1.0]
    q = [r / sum(raw) for r in raw]
    approx(m.q[0], q)
    assert q[1] > q[0] > q[2]
    approx(loss, [q[0] * l0 + q[1] * l1])
    m.loss(batch())  # q is kept across steps and keeps moving toward class 1
    assert float(m.q[0, 1]) > q[1]


def test_fair_dro_mean_plus_alpha_std() -> None:
    m = build("fair_dro", make_ctx(Y_TRAIN_BAL), {"alpha": 0.5}, {"alpha": 0.0})
    l0, l1 = ce(LOGITS[0], 0), ce(LOGITS[1], 1)
    mean, std = (l0 + l1) / 2, abs(l0 - l1) / 2  # class 2 absent from the batch: two classes
    approx(m.loss(batch(h=2)), [mean + 0.5 * std, mean])


def test_fair_dro_equals_the_chi2_worst_case_weights() -> None:
    """mean + α σ = Σ q_k ℓ_k with q_k = (1 + α(ℓ_k − ℓ̄)/σ)/K, which lies on the χ² ball of radius α."""
    logits = [[2.0, 0.0, 0.0], [0.0, 0.3, 0.0], [0.0, 0.0, -1.0]]
    m = build("fair_dro", make_ctx(Y_TRAIN_BAL), {"alpha": 0.5})
    losses = [ce(v, y) for v, y in zip(logits, [0, 1, 2])]
    mean = sum(losses) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in losses) / 3)
    q = [(1 + 0.5 * (x - mean) / sd) / 3 for x in losses]
    assert sum((3 * x - 1) ** 2 for x in q) / 3 == pytest.approx(0.25)
    approx(m.loss(batch(logits, [0, 1, 2])), [sum(a * b for a, b in zip(q, losses))])


def test_jtt_weights_the_stage1_error_set() -> None:
    calls = []
    # stage-1 logits for 4 training samples (labels 0, 1, 2, 0): wrong on samples 1 and 3
    stage1 = torch.tensor([[[5.0, 0, 0], [5.0, 0, 0], [0, 0, 5.0], [0, 5.0, 0]]], dtype=torch.float64)

    def aux(method: str, hps: list[dict], epochs: int) -> torch.Tensor:
        calls.append((method, hps, epochs))
        return stage1.expand(len(hps), -1, -1)

    m = build("jtt", make_ctx([0, 1, 2, 0], train_aux=aux, epochs=7), {"lam_up": 5.0}, {"lam_up": 20.0})
    assert calls == [("ce", [{"lr": 1e-2, "weight_decay": 0.0}], 2)]  # one shared stage 1, T = 7 // 3
    assert m.error_set.tolist() == [[False, True, False, True]] * 2
    assert m.info()[1]["jtt_error_set_size"] == 2
    logits = [LOGITS[0], LOGITS[1], LOGITS[0]]
    got = m.loss(batch(logits, [0, 1, 0], h=2, idx=[0, 1, 3]))
    # divided by the mean weight over the training set, w̄ = (2 + 2 λ_up) / 4: the upsampled set's mean
    ref = [(ce(LOGITS[0], 0) + up * ce(LOGITS[1], 1) + up * ce(LOGITS[0], 0)) / 3 / ((2 + 2 * up) / 4)
           for up in (5.0, 20.0)]
    approx(got, ref)


def test_lff_by_hand() -> None:
    m = build("lff", make_ctx(Y_TRAIN_BAL, rep_dim=2), {"q": 0.7})
    assert [tuple(p.shape) for p in m.extra_parameters()] == [(1, 3, 2), (1, 3)]
    with torch.no_grad():
        m.biased["W"].copy_(torch.tensor([[[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]]]))
        m.biased["b"].zero_()
    rep = torch.tensor([[[1.0, 2.0], [0.5, -1.0]]], dtype=torch.float64, requires_grad=True)
    zb = [[1.0, 2.0, -3.0], [0.5, -1.0, 0.5]]  # biased logits W·rep
    ce_b = [ce(v, y) for v, y in zip(zb, Y)]
    ce_d = [ce(v, y) for v, y in zip(LOGITS, Y)]
    ref = sum(b / (b + d) * d for b, d in zip(ce_b, ce_d)) / 2 + sum((1 - math.exp(-0.7 * b)) / 0.7 for b in ce_b) / 2
    loss = m.loss(batch(rep=rep))
    approx(loss, [ref])
    approx(m.ema_b[0, :2], ce_b)  # EMA (a = 0.7): a sample's first visit sets it to the loss
    loss.sum().backward()
    assert rep.grad is None  # the biased head reads the representation detached
    assert m.biased["W"].grad is not None


def test_supcon_equals_anchor_loop() -> None:
    torch.manual_seed(0)
    z = torch.randn(2, 5, 3, dtype=torch.float64)
    y = [0, 1, 0, 0, 2]  # class 1 and 2 have one sample: not anchors (but still in the denominators)
    m = build("supcon", make_ctx(Y_TRAIN_BAL, rep_dim=3), {"temperature": 0.1}, {"temperature": 0.5})
    logits = [LOGITS[0], LOGITS[1], LOGITS[0], LOGITS[1], LOGITS[0]]
    got = m.loss(batch(logits, y, h=2, rep=z))
    for h, t in enumerate((0.1, 0.5)):
        u = [[a / math.sqrt(sum(b * b for b in row)) for a in row] for row in z[h].tolist()]
        dot = [[sum(a * b for a, b in zip(u[i], u[j])) / t for j in range(5)] for i in range(5)]
        per = []
        for i in range(5):
            pos = [p for p in range(5) if p != i and y[p] == y[i]]
            if pos:
                den = lse([dot[i][a] for a in range(5) if a != i])
                per.append(-sum(dot[i][p] - den for p in pos) / len(pos))
        ce_mean = sum(ce(v, yy) for v, yy in zip(logits, y)) / 5
        assert float(got[h]) == pytest.approx(sum(per) / len(per) + ce_mean, rel=1e-9)


# ---- reductions on a balanced training set (baselines.md) -------------------------------------------------

def test_balanced_reductions() -> None:
    ctx = make_ctx(Y_TRAIN_BAL)
    ref = build("ce", ctx).loss(batch())
    for name in ("logit_adjust", "balanced_softmax", "class_balanced"):
        torch.testing.assert_close(build(name, ctx).loss(batch()), ref, rtol=1e-12, atol=1e-12)
    approx(build("class_balanced", ctx).weights[0], [1.0, 1.0, 1.0])
    ldam = build("ldam", ctx, {"max_m": 0.5})
    approx(ldam.delta[0], [0.5, 0.5, 0.5])  # the same margin for every class
    assert not bool(build("eql", ctx).rare.any())  # no rare class: plain one-vs-all sigmoid CE


# ---- per-head hyperparameters: a 2-head instance equals two 1-head instances ------------------------------

@pytest.mark.parametrize("name,key,values", [
    ("focal", "gamma", (1.0, 3.0)), ("label_smoothing", "eps", (0.0, 0.3)), ("ldam", "max_m", (0.2, 0.8)),
    ("logit_adjust", "tau", (0.5, 2.0)), ("class_balanced", "beta", (0.9, 0.999)), ("eql", "lam_rel", (0.1, 2.0)),
    ("group_dro", "eta", (0.01, 1.0)), ("fair_dro", "alpha", (0.0, 1.0)),
])
def test_heads_are_independent(name: str, key: str, values: tuple[float, float]) -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 6, 3, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 0, 0, 1])
    ctx = make_ctx(Y_TRAIN_IMB)
    both = build(name, ctx, *({key: v} for v in values)).loss(Batch(logits, torch.zeros(1, 6, 2), y, y))
    for i, v in enumerate(values):
        one = build(name, ctx, {key: v}).loss(Batch(logits[i:i + 1], torch.zeros(1, 6, 2), y, y))
        torch.testing.assert_close(both[i:i + 1], one, rtol=1e-12, atol=1e-12)


# ---- MR2 ablations ----------------------------------------------------------------------------------------

def test_mr2_ablations_change_one_default() -> None:
    changed = {"mr2_uniform": {"uniform": True}, "mr2_no_rep": {"lam": 0.0}, "mr2_sqrt": {"exponent": 0.5},
               "mr2_linear": {"exponent": 1.0}}
    for name, diff in changed.items():
        cls = METHODS.get(name)
        assert issubclass(cls, MR2) and cls.grid == MR2.grid
        assert {k: v for k, v in cls.defaults.items() if MR2.defaults[k] != v} == diff


@pytest.mark.parametrize("name", ["mr2", "mr2_uniform", "mr2_sqrt", "mr2_linear"])
def test_mr2_ablation_margins(name: str) -> None:
    z = torch.tensor([[1.0, 0], [3, 0], [0, 2], [0, 2], [1, 1]], dtype=torch.float64)
    y = torch.tensor([0, 0, 1, 1, 2])
    ctx = make_ctx(y.tolist(), represent_train=lambda: iter([(z[None], y)]))
    m = build(name, ctx, {"c_bar": 2.0})
    v = class_stats(z, y, 3, p=3).v
    expected = {"mr2": margins(v, 2.0, 1 / 3), "mr2_uniform": torch.full((3,), 2.0),
                "mr2_sqrt": margins(v, 2.0, 0.5), "mr2_linear": margins(v, 2.0, 1.0)}[name]
    torch.testing.assert_close(m.gamma[0], expected.to(torch.float64))


# ---- through the trainer ----------------------------------------------------------------------------------

def synthetic(n: tuple[int, ...] = (30, 15, 6), d: int = 12, seed: int = 0) -> TrainData:
    """Imbalanced Gaussian classes; val has 4 samples per class."""
    g = torch.Generator().manual_seed(seed)
    k = len(n)
    centers = torch.randn(k, d, generator=g) * 2

    def draw(counts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.cat([torch.full((c,), i) for i, c in enumerate(counts)])
        return centers[y] + torch.randn(len(y), d, generator=g), y

    x, y = draw(list(n))
    vx, vy = draw([4] * k)
    return TrainData(x, y, vx, vy, k)


def quick_cfg(**probe: Any) -> TrainConfig:
    return TrainConfig(epochs=2, batch_size=16, lr=(1e-2,), wd=(1e-4,), min_steps=0,
                       probe=ProbeConfig(**probe), device="cpu", progress=False)


@pytest.mark.parametrize("probe", [{"head": "linear", "adapter": "none"},
                                   {"head": "cosine", "adapter": "linear", "width": 8}])
def test_every_method_trains_two_epochs(probe: dict[str, Any]) -> None:
    data, cfg = synthetic(), quick_cfg(**probe)
    names = [n for n in METHODS.names() if probe["adapter"] != "none" or not METHODS.get(n).needs_adapter]
    specs = [RunSpec(n, tuple(sorted(hp.items())), 0) for n in names for hp in method_hparams(n, cfg)]
    trained = train_stack(data, specs, cfg)
    logits = trained.predict(data.val_x)
    assert logits.shape == (len(specs), len(data.val_y), 3) and bool(torch.isfinite(logits).all())
    assert {s.method for s in trained.specs} == set(names)
    json.dumps(trained.info)


def test_supcon_without_adapter_is_refused() -> None:
    cfg = quick_cfg()
    specs = [RunSpec("supcon", tuple(sorted(hp.items())), 0) for hp in method_hparams("supcon", cfg)]
    with pytest.raises(UserError, match="needs a trainable adapter"):
        train_stack(synthetic(), specs, cfg)


def test_jtt_really_trains_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The upweighted set is exactly what an ERM probe (same lr, wd, seed) trained for T epochs gets wrong."""
    jtt_cls = METHODS.get("jtt")
    seen: list[Method] = []
    original = jtt_cls.prepare

    def spy(self: Method) -> None:
        seen.append(self)
        original(self)

    monkeypatch.setattr(jtt_cls, "prepare", spy)
    data = synthetic((30, 15, 6), d=4, seed=3)  # overlapping classes: stage 1 makes mistakes
    cfg = TrainConfig(epochs=3, batch_size=16, lr=(1e-3,), wd=(1e-4,), min_steps=0, device="cpu",
                      progress=False)
    specs = [RunSpec("jtt", tuple(sorted(hp.items())), 5) for hp in method_hparams("jtt", cfg)]
    trained = train_stack(data, specs, cfg)
    (m,) = seen
    stage1 = train_stack(data, [RunSpec("ce", (("lr", 1e-3), ("weight_decay", 1e-4)), 5)], cfg, epochs=1)
    wrong = stage1.predict(data.x)[0].argmax(-1) != data.y
    assert 0 < int(wrong.sum()) < len(data.y)
    assert m.error_set.tolist() == [wrong.tolist()] * 2  # both λ_up grid points share that stage 1
    assert [i["jtt_error_set_size"] for i in trained.info] == [int(wrong.sum())] * 2
    up = torch.tensor([5.0, 20.0])[:, None]
    assert torch.equal(m.weights, torch.where(wrong, up, torch.ones(1)))


def test_cli_lists_every_method() -> None:
    out = run_cli("methods", timeout=120)
    assert out.returncode == 0, out.stderr
    listed = {line.split()[0] for line in out.stdout.splitlines() if line and not line.startswith(" ")}
    assert set(METHOD_NAMES) <= listed
