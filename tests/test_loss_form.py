"""The stack's one-pass loss form (mr2probe.losses) against a plain per-method implementation of every method's
formula (tests/reference_losses.py): loss and gradient of every probe parameter, float64, 1e-10 relative, on random
stacks with both heads, with and without a trainable adapter, each method alone and all of them in one stack."""
from __future__ import annotations

import pytest
import torch

from mr2probe.heads import ProbeConfig, ProbeStack
from mr2probe.losses import LossTables, Terms, stack_loss
from mr2probe.methods import METHODS
from mr2probe.trainer import StackStep, TrainConfig, TrainData, build_methods, expand_runs

from reference_losses import REFERENCES, reference_loss

F64 = torch.float64
K, D, N = 4, 6, 40


def data() -> TrainData:
    g = torch.Generator().manual_seed(0)
    y = torch.tensor([0] * 16 + [1] * 12 + [2] * 8 + [3] * 4)  # imbalanced, so the priors and weights matter
    x = torch.randn(N, D, generator=g, dtype=F64) + y[:, None].to(F64)
    return TrainData(x, y, x[:12], y[:12], K)


def stack(methods: list[str], head: str, adapter: str) -> tuple[StackStep, list, ProbeStack, TrainData]:
    d = data()
    cfg = TrainConfig(lr=(1e-2, 3e-2), wd=(0.0,), scale=(8.0,), progress=False,
                      probe=ProbeConfig(head=head, adapter=adapter, width=5))
    specs = sorted(expand_runs(methods, [3], cfg), key=lambda s: s.method)
    probe = ProbeStack(cfg.probe, D, K, [s.seed for s in specs], [s.params.get("scale", 8.0) for s in specs]).to(F64)
    built = build_methods(d, specs, cfg, probe, epochs=3, log=lambda m: None)
    for m, _ in built:
        m.on_epoch_start(1)  # LDAM's and CDB's epoch-dependent weights (CDB measures its held-out accuracy)
    detach = torch.tensor([type(m).detach_head_input for m, v in built for _ in range(v.h)])
    step = StackStep(probe, built, K, detach if bool(detach.any()) else None, None)
    return step, built, probe, d


def params(probe: ProbeStack, built: list) -> list[torch.Tensor]:
    return list(probe.parameters()) + [p for m, _ in built for p in m.extra_parameters()]


def check(methods: list[str], head: str, adapter: str) -> None:
    step, built, probe, d = stack(methods, head, adapter)
    idx = torch.tensor([3, 17, 30, 39, 0, 20, 35, 5, 1, 29, 37, 12])
    xb, yb = d.x[idx], d.y[idx]
    rep, logits = probe(xb, step.detach)
    reps = rep.split([v.h for _, v in built]) if rep.shape[0] > 1 else [rep] * len(built)
    ref = sum(reference_loss(m, logits[v.sl], r, yb, idx).sum() for (m, v), r in zip(built, reps))  # before: the
    # references read the methods' state as it is before the step
    ps = params(probe, built)
    g_ref = torch.autograd.grad(ref, ps, allow_unused=True)
    got = step(xb, yb, idx)
    g_got = torch.autograd.grad(got, ps, allow_unused=True)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)
    for a, b in zip(g_got, g_ref):
        if a is None or b is None:
            assert a is None or not a.any()
            assert b is None or not b.any()
            continue
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


NO_ADAPTER = [n for n in METHODS.names() if not METHODS.get(n).needs_adapter]


@pytest.mark.parametrize("head", ["linear", "cosine"])
@pytest.mark.parametrize("method", sorted(REFERENCES))
def test_every_method_equals_its_formula(method: str, head: str) -> None:
    adapter = "linear" if METHODS.get(method).needs_adapter else "none"
    check([method], head, adapter)


@pytest.mark.parametrize("head", ["linear", "cosine"])
@pytest.mark.parametrize("method", ["mr2", "lff", "group_dro", "supcon", "ldam", "eql"])
def test_with_an_adapter_every_method_equals_its_formula(method: str, head: str) -> None:
    check([method], head, "linear")


@pytest.mark.parametrize("head,adapter", [("linear", "none"), ("cosine", "none"), ("linear", "linear"),
                                          ("cosine", "mlp")])
def test_the_whole_stack_equals_the_sum_of_its_formulas(head: str, adapter: str) -> None:
    names = sorted(REFERENCES) if adapter != "none" else sorted(n for n in REFERENCES if n in NO_ADAPTER)
    check(names, head, adapter)


def test_every_registered_method_has_a_reference() -> None:
    assert set(METHODS.names()) <= set(REFERENCES)


def test_the_closed_form_gradient_passes_gradcheck() -> None:
    """Every term at once on random rows (scale per true class, offset, margin, smoothing, focal, GCE, class weights,
    a hook, a sigmoid row): the closed-form backward against finite differences."""
    g = torch.Generator().manual_seed(1)
    h, b, k = 4, 5, 3
    y = torch.tensor([0, 2, 1, 2, 0])
    t = LossTables(h, k, "cpu", F64)
    t.write(slice(0, 1), Terms(scale=torch.rand(1, k, generator=g, dtype=F64) + 0.5,
                               offset=torch.randn(1, k, generator=g, dtype=F64),
                               margin=torch.rand(1, k, generator=g, dtype=F64)))
    t.write(slice(1, 2), Terms(smoothing=torch.tensor([0.2], dtype=F64), focal=torch.tensor([1.5], dtype=F64),
                               class_weight=torch.rand(1, k, generator=g, dtype=F64) + 0.5))
    t.write(slice(2, 3), Terms(gce=torch.tensor([0.7], dtype=F64), scale=torch.tensor([2.0], dtype=F64)))
    t.write(slice(3, 4), Terms(sigmoid=True, negatives_dropped=torch.tensor([[False, True, False]])))
    w = torch.rand(1, b, generator=g, dtype=F64) + 0.5
    z = torch.randn(h, b, k, generator=g, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: stack_loss(v, y, t, [(slice(1, 2), lambda c: w)]), (z,))


def test_a_plain_ce_stack_takes_no_optional_term() -> None:
    """Plain CE heads declare nothing: the pass computes CE and the tables say no optional term is used."""
    step, built, probe, d = stack(["ce"], "linear", "none")
    assert step.tables.uses == set() and step.tables.sigmoid == []
