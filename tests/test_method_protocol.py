"""The method protocol (docs/methods.md, "Writing a method"): the typed view a method sees (``FitContext``), the name
the registry gives a method class, the trainer's auxiliary capability (``ctx.aux``), the heads' own transform and
the typed keys of the shared statistics."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch

from mr2probe import trainer
from mr2probe.heads import HEADS, CosineHead, HeadSet, ProbeConfig
from mr2probe.methods import (METHODS, Auxiliary, Batch, ClassStatsKey, FitContext, FitData, FitSchedule,
                              HeadsView, Method, SharedKey, SharedStats)
from mr2probe.methods.ce import CrossEntropy
from mr2probe.methods.focal import Focal
from mr2probe.trainer import RunSpec, method_hparams, train_stack
from test_methods import build, make_ctx, quick_cfg, synthetic

DOCS = Path(__file__).resolve().parents[1] / "docs" / "methods.md"

# the view, field by field, as docs/methods.md lists it
DOCUMENTED: dict[type, list[str]] = {
    FitContext: ["data", "heads", "schedule", "aux", "shared", "log"],
    FitData: ["x", "y", "val_x", "val_y", "num_classes"],
    HeadsView: ["config", "rep_dim", "represent_train", "predict", "represent_input_train", "represent_input"],
    FitSchedule: ["epochs", "batch_size", "seed"],
}
PROPERTIES = {FitData: ["counts", "device", "dtype"]}  # derived, read-only
SUB = {"data": FitData, "heads": HeadsView, "schedule": FitSchedule}


@pytest.fixture
def register() -> Iterator[Callable[[str, type[Method]], type[Method]]]:
    """``register(name, cls)`` as a plugin would (``@METHODS.register(name)``), undone after the test."""
    names: list[str] = []

    def add(name: str, cls: type[Method]) -> type[Method]:
        names.append(name)
        return METHODS.register(name)(cls)

    yield add
    for name in names:
        METHODS._items.pop(name, None)
        METHODS._help.pop(name, None)


def trained_instances(data: trainer.TrainData, name: str, cfg: trainer.TrainConfig,
                      monkeypatch: pytest.MonkeyPatch) -> list[Method]:
    """The prepared instances of method ``name`` that one ``train_stack`` builds (one seed, its whole grid)."""
    seen: list[Method] = []
    cls = METHODS.get(name)
    original = cls.prepare

    def spy(self: Method) -> None:
        seen.append(self)
        original(self)

    monkeypatch.setattr(cls, "prepare", spy)
    train_stack(data, [RunSpec(name, tuple(sorted(hp.items())), 0) for hp in method_hparams(name, cfg)], cfg)
    return seen


def public(obj: Any) -> set[str]:
    return {n for n in dir(obj) if not n.startswith("_")}


def test_a_method_sees_exactly_the_documented_typed_view(register, monkeypatch: pytest.MonkeyPatch) -> None:
    class ThirdParty(CrossEntropy):
        """A method from outside the package."""

    register("third_party_view", ThirdParty)
    (m,) = trained_instances(synthetic(), "third_party_view", quick_cfg(), monkeypatch)
    ctx = m.ctx
    for cls, names in DOCUMENTED.items():
        assert [f.name for f in dataclasses.fields(cls)] == names
    assert public(ctx) == set(DOCUMENTED[FitContext])  # nothing else: no trainer, no probe stack, no callbacks
    for attr, cls in SUB.items():
        view = getattr(ctx, attr)
        assert type(view) is cls
        assert public(view) == set(DOCUMENTED[cls]) | set(PROPERTIES.get(cls, []))
        with pytest.raises(dataclasses.FrozenInstanceError):  # read-only
            setattr(view, DOCUMENTED[cls][0], None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.data = None  # type: ignore[misc]
    assert isinstance(ctx.aux, Auxiliary) and isinstance(ctx.shared, SharedStats)
    assert public(ctx.aux) >= {"train", "new_heads"}
    assert ctx.schedule == FitSchedule(epochs=2, batch_size=16, seed=0)
    assert ctx.heads.config == quick_cfg().probe and ctx.heads.rep_dim == 12
    assert ctx.data.counts.tolist() == [30.0, 15.0, 6.0]
    doc = DOCS.read_text()  # every field is named in the page that tells how to write a method
    missing = [f"ctx.{n}" for n in DOCUMENTED[FitContext] if f"ctx.{n}" not in doc]
    missing += [f"ctx.{a}.{n}" for a, cls in SUB.items() for n in DOCUMENTED[cls] + PROPERTIES.get(cls, [])
                if f"ctx.{a}.{n}" not in doc]
    assert missing == []


def test_a_third_party_method_gets_its_name_from_the_registry(register, monkeypatch: pytest.MonkeyPatch) -> None:
    class Mine(Method):
        """Plain CE, from outside the package."""

    class MyFocal(Focal):
        """Focal loss, subclassed."""

    register("my_method", Mine)
    register("my_focal", MyFocal)
    assert Mine.name == "my_method" and MyFocal.name == "my_focal"
    assert METHODS.get("focal").name == "focal" and Focal.name == "focal"  # the parent keeps its own
    (m,) = trained_instances(synthetic(), "my_method", quick_cfg(), monkeypatch)
    assert m.name == "my_method" and "name" not in vars(m)  # the class's, not set on the instance by the trainer
    assert all(METHODS.get(n).name == n for n in METHODS.names())


@pytest.mark.parametrize("name", HEADS.names())
def test_a_head_declares_whether_it_transforms_its_input(name: str) -> None:
    head = HEADS.get(name)()
    z = 3 * torch.randn(1, 5, 4, generator=torch.Generator().manual_seed(0))
    assert head.has_own_transform == (not torch.equal(head.represent(z), z))


def test_shared_statistics_are_keyed_by_typed_keys() -> None:
    store, calls = SharedStats(), []

    def compute(value: str) -> Callable[[], str]:
        return lambda: calls.append(value) or value

    assert store.get_or_compute(ClassStatsKey(head="cosine", stats_on="input", p=3.0), compute("a")) == "a"
    assert store.get_or_compute(ClassStatsKey("cosine", "input", 3.0), compute("b")) == "a"  # equal key: computed once
    assert store.get_or_compute(ClassStatsKey("cosine", "classifier", 3.0), compute("c")) == "c"
    assert calls == ["a", "c"] and len(store) == 2

    @dataclasses.dataclass(frozen=True)
    class OtherKey(SharedKey[str]):
        head: str
        stats_on: str
        p: float

    assert OtherKey("cosine", "input", 3.0) not in store  # the same fields under another key class: no collision
    with pytest.raises(TypeError, match="SharedKey"):
        store.get_or_compute(("mr2-stats", "cosine", "input", 3.0), compute("d"))  # type: ignore[arg-type]


def test_mr2_shares_its_frozen_statistics_under_a_class_stats_key() -> None:
    data = synthetic()
    cfg = quick_cfg(head="cosine")
    train_stack(data, [RunSpec("mr2", tuple(sorted(hp.items())), 0) for hp in method_hparams("mr2", cfg)], cfg)
    # a cosine head transforms its input: the default stats_on=input is measured on g(x) (here the features)
    assert ClassStatsKey(head="cosine", stats_on="input", p=3.0) in data.shared and len(data.shared) == 1


def test_auxiliary_stages_and_heads_come_from_the_trainer(monkeypatch: pytest.MonkeyPatch) -> None:
    """JTT's first stage is one :func:`trainer.train_auxiliary` call; LfF's biased heads are the trainer's fresh
    heads of the probe's kind (``ctx.aux.new_heads``), as :meth:`HeadSet.fresh` makes them."""
    stages: list[tuple[str, int]] = []
    real = trainer.train_auxiliary

    def counting(data: Any, cfg: Any, method: str, hparams: Any, seed: int, epochs: int, *rest: Any) -> Any:
        stages.append((method, epochs))
        return real(data, cfg, method, hparams, seed, epochs, *rest)

    monkeypatch.setattr(trainer, "train_auxiliary", counting)
    data, cfg = synthetic(), quick_cfg(head="cosine")
    (jtt,) = trained_instances(data, "jtt", cfg, monkeypatch)
    assert stages == [("ce", 1)]  # T = max(1, 2 // 3): one stage shared by the λ_up grid
    new_heads: list[HeadSet] = []
    original = trainer.AuxiliaryStages.new_heads
    monkeypatch.setattr(trainer.AuxiliaryStages, "new_heads", lambda self, seeds, scales: new_heads.append(
        original(self, seeds, scales)) or new_heads[-1])
    (lff,) = trained_instances(data, "lff", cfg, monkeypatch)
    assert [h is lff.biased_heads for h in new_heads] == [True]
    assert isinstance(lff.biased_heads.head, CosineHead)
    h = lff.h  # the lr × wd × cosine-scale grid
    fresh = HeadSet.fresh(ProbeConfig(head="cosine"), [7777] * h, 3, 12, lff.head_scales(), torch.device("cpu"),
                          torch.float32)
    assert fresh.params.keys() == lff.biased.keys() and fresh.params["W"].shape == lff.biased["W"].shape == (h, 3, 12)
    assert not torch.equal(fresh.params["W"], lff.biased["W"])  # trained since
    assert lff.extra_parameters() == [lff.biased["W"]]  # a fixed cosine scale is not trained


def test_the_example_in_the_docs_registers_and_computes_its_loss() -> None:
    """docs/methods.md's example method, run as written: registered by its name, ℓ = ω_y·CE(z, y) by hand."""
    text = DOCS.read_text().split("## Writing a method", 1)[1]
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    before = set(METHODS.names())
    try:
        exec(compile(code, str(DOCS), "exec"), {"__name__": "docs_example"})
        (name,) = set(METHODS.names()) - before
        cls = METHODS.get(name)
        assert cls.name == name == "inverse_freq"
        y_train = [0] * 6 + [1] * 3 + [2]  # n = (6, 3, 1): ω_k = (10 / (3 n_k))^α
        m = build(name, make_ctx(y_train), {"alpha": 1.0}, {"alpha": 0.5})
        logits = torch.tensor([[2.0, 0.5, -1.0], [0.0, 1.0, 3.0]], dtype=torch.float64)
        y = [0, 2]
        loss = m.loss(Batch(logits.expand(2, -1, -1), torch.zeros(1, 2, 2, dtype=torch.float64), torch.tensor(y),
                            torch.tensor([0, 9])))
        ce = [float(torch.logsumexp(v, 0) - v[c]) for v, c in zip(logits, y)]
        for i, alpha in enumerate((1.0, 0.5)):
            w = [(10 / (3 * n)) ** alpha for n in (6, 3, 1)]
            assert float(loss[i]) == pytest.approx(sum(w[c] * e for c, e in zip(y, ce)) / 2, rel=1e-12)
    finally:
        for n in set(METHODS.names()) - before:
            METHODS._items.pop(n, None)
            METHODS._help.pop(n, None)
