"""Successive halving over the grid (``search="halving"``, η = 3): every grid point starts in the stack; at the rungs
⌈T/9⌉ and ⌈T/3⌉ each method keeps its best ⌈n/3⌉, then ⌈n/9⌉ heads on val; stopped heads are frozen and leave the
stack; selection among the heads that reach the budget; recorded in results.json. ``full`` is unchanged."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import BUNDLED, write_by_hand
from mr2probe.errors import UserError
from mr2probe.experiment import _config_key, _keyed_train, config_from_settings, run_experiment
from mr2probe.featurestore import content_sha256
from mr2probe.jsonfile import grid_rows
from mr2probe.metrics import null_name
from mr2probe.optim import StackedAdamW, cosine_restarts
from mr2probe.trainer import (TrainConfig, TrainData, expand_runs, halving_rungs, halving_survivors, head_chunks,
                              search_schedule, train_stack)


def _gauss(seed: int = 0, k: int = 4, d: int = 16, n: int = 400) -> TrainData:
    g = torch.Generator().manual_seed(seed)
    centers = 2.0 * torch.randn(k, d, generator=g)
    y = torch.arange(n) % k
    vy = torch.arange(n // 2) % k
    return TrainData(centers[y] + torch.randn(n, d, generator=g), y, centers[vy] + torch.randn(n // 2, d, generator=g),
                     vy, k)


def _cfg(**kw) -> TrainConfig:
    # 400 rows, batch 64: 7 steps per epoch; min_steps 36 → 6 epochs, T = 42, rungs ⌈42/9⌉ = 5 and ⌈42/3⌉ = 14
    base = dict(epochs=1, min_steps=36, batch_size=64, lr=(1e-4, 1e-3, 1e-2), wd=(0.0, 1e-2, 1e-1),
                search="halving", progress=False)
    return TrainConfig(**{**base, **kw})


def test_the_rung_schedule() -> None:
    assert halving_rungs(42) == [(5, 1), (14, 2)]
    assert halving_rungs(1000) == [(112, 1), (334, 2)]
    assert halving_rungs(9) == [(1, 1), (3, 2)]
    assert halving_rungs(2) == [(1, 1), (1, 2)]  # one step: both cuts there
    assert halving_rungs(1) == []
    for n in range(1, 40):
        assert halving_survivors(n, 1) == -(-n // 3) >= 1 and halving_survivors(n, 2) == -(-n // 9) >= 1
    sched = search_schedule(400, _cfg())
    assert sched == {"rule": "halving", "eta": 3, "steps": 42,
                     "rungs": [{"step": 5, "keep": "ceil(n/3)"}, {"step": 14, "keep": "ceil(n/9)"}],
                     "select": "among the heads that reach the budget"}
    assert search_schedule(400, _cfg(search="full")) is None
    assert search_schedule(400, _cfg(search="halving-restarts"))["rule"] == "halving-restarts"
    with pytest.raises(UserError, match="--search must be one of full, halving, halving-restarts"):
        _cfg(search="random").check()


@pytest.mark.parametrize("chunk_mib", [16.0, 0.001])  # one stack; chunks of whole methods
def test_each_method_keeps_a_third_then_a_ninth(chunk_mib: float) -> None:
    cfg = _cfg(chunk_mib=chunk_mib, method_params={"focal": {}})
    methods = ["ce", "mr2", "focal", "lff", "group_dro"]  # 9, 18, 9, 9, 9 grid points
    specs = expand_runs(methods, [0], cfg) + expand_runs(["ldam"], [0], replace(cfg, lr=(1e-2,),
                                                                              wd=(0.0, 0.1)))
    t = train_stack(_gauss(), specs, cfg)
    assert t.rungs == [5, 14] and len(t.stopped_at) == len(t.specs) == t.probe.num_heads
    for m in methods + ["ldam"]:
        stop = np.array([t.stopped_at[i] for i, s in enumerate(t.specs) if s.method == m])
        n = len(stop)
        assert set(stop) <= {5, 14, 42}
        assert (stop > 5).sum() == -(-n // 3) and (stop == 42).sum() == -(-n // 9), m
        assert [f for f, s in zip(t.finished, t.specs) if s.method == m].count(True) == -(-n // 9)
    if chunk_mib < 1:
        assert len(head_chunks(sorted(specs, key=lambda s: s.method), 2, whole=True)) == 6  # never split


def test_the_survivors_are_each_methods_best_on_val_at_the_rung_and_stopped_heads_are_frozen(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Until its rung a head follows the full search's trajectory bit for bit (the same stack); from then on its
    parameters stay those of that step; the first rung keeps each method's best third on val at that step."""
    data, cfg = _gauss(), _cfg()
    specs = expand_runs(["ce", "lff"], [0], cfg)
    snaps: dict[int, dict[str, torch.Tensor]] = {}
    step = StackedAdamW.step

    def recording(self: StackedAdamW) -> None:
        step(self)
        if int(self.t) in (5, 14):
            snaps[int(self.t)] = [p.detach().clone() for p in self.groups[0][0]]

    monkeypatch.setattr(StackedAdamW, "step", recording)
    train_stack(data, specs, replace(cfg, search="full"))
    at = {t: dict(zip(["head_W", "head_b"], ps)) for t, ps in snaps.items()}
    monkeypatch.setattr(StackedAdamW, "step", step)
    half = train_stack(data, specs, cfg)
    state = half.probe.state_dict()
    stop = np.array(half.stopped_at)
    first = np.flatnonzero(stop == 5)
    for k in ("head_W", "head_b"):
        assert torch.equal(state[k][first], at[5][k][first])
    # the first rung keeps each method's best third by the val score at step 5 (the full run's heads then)
    w, b = at[5]["head_W"], at[5]["head_b"]
    acc = ((torch.einsum("nd,hkd->hnk", data.val_x, w) + b[:, None]).argmax(-1) == data.val_y).double().mean(1)
    for m in ("ce", "lff"):
        heads = [i for i, s in enumerate(specs) if s.method == m]
        ranked = sorted(heads, key=lambda i: (-float(acc[i]), i))
        assert sorted(ranked[:3]) == [i for i in heads if stop[i] > 5]
    assert all(s.method == h.method and s.hparams == h.hparams for s, h in zip(specs, half.specs))


def test_halving_restarts_anneals_every_head_at_each_rung(monkeypatch: pytest.MonkeyPatch) -> None:
    """``halving-restarts``: cosine cycles end at the rungs 5, 14 and at T = 42, so the step before each rung runs at
    f ≈ 0 (the heads are ranked annealed) and the next at f = 1 (``halving``: one cycle of 42 steps); the cuts follow
    the same rule (a third, then a ninth)."""
    ends: list[list[int]] = []
    init = StackedAdamW.__init__

    def recording(self: StackedAdamW, *a, **kw) -> None:
        init(self, *a, **kw)
        ends.append(list(self.cycle_ends))

    monkeypatch.setattr(StackedAdamW, "__init__", recording)
    data, specs = _gauss(), expand_runs(["ce"], [0], _cfg())
    plain = train_stack(data, specs, _cfg())
    restarted = train_stack(data, specs, _cfg(search="halving-restarts"))
    assert ends == [[42], [5, 14, 42]]
    assert [cosine_restarts(t, ends[1]) for t in (0, 5, 14)] == [1.0, 1.0, 1.0]
    assert cosine_restarts(4, ends[1]) == pytest.approx(0.5 * (1 + np.cos(np.pi * 4 / 5)))
    assert restarted.rungs == plain.rungs == [5, 14]
    assert sorted(restarted.stopped_at) == sorted(plain.stopped_at) == [5] * 6 + [14] * 2 + [42]
    # the checkpoints rule keeps its own cycles: the rungs fall inside them
    train_stack(data, specs, _cfg(search="halving-restarts", budget_rule="checkpoints", max_steps=168))
    assert ends[-1] == [42, 84, 168]


def test_halving_composes_with_checkpoints() -> None:
    """Rungs ⌈T/9⌉, ⌈T/3⌉ of the last checkpoint T; survivors keep their best checkpoint, stopped heads have none."""
    cfg = _cfg(budget_rule="checkpoints", max_steps=168)  # F = 42: checkpoints 42, 84, 168
    t = train_stack(_gauss(), expand_runs(["ce"], [0], cfg), cfg)
    assert t.checkpoints == [42, 84, 168] and t.rungs == [19, 56]
    stop = np.array(t.stopped_at)
    assert sorted(stop.tolist()) == [19] * 6 + [56] * 2 + [168]
    for i, s in enumerate(stop):
        if s == 168:
            assert t.checkpoint_step[i] in (42, 84, 168) and not np.isnan(t.checkpoint_scores[:, i]).any()
        else:
            assert t.checkpoint_step[i] is None
            assert np.isnan(t.checkpoint_scores[2:, i]).all()  # stopped before 84
    assert (~np.isnan(t.checkpoint_scores[0])).sum() == 3  # at 42 only the heads kept at 19 are live


def _experiment(feats: Path, out: Path, search: str, **values):
    vals = {"epochs": 1, "min_steps": 36, "batch_size": 64, "lr": (1e-4, 1e-3, 3e-2), "wd": (0.0, 1e-4, 1e-3),
            "device": "cpu", "search": search, **values}
    return config_from_settings(feats, out, ["ce", "focal"], [0, 1], values=vals, progress=False)


def test_results_json_records_the_schedule_and_where_each_head_stopped(tmp_path: Path) -> None:
    feats = write_by_hand(tmp_path / "f.h5", k=4, d=8, n_train=448, n_test=80, val=True)
    res = run_experiment(_experiment(feats, tmp_path / "run", "halving"))
    assert res["budget"]["steps"] == 42
    assert res["budget"]["search"]["rungs"] == [{"step": 5, "keep": "ceil(n/3)"}, {"step": 14, "keep": "ceil(n/9)"}]
    assert res["budget"]["search"]["eta"] == 3 and res["config"]["train"]["search"] == "halving"
    assert {r["method"] for r in res["runs"]} == {"ce", "focal", null_name("ce")}  # the null control halves too
    for r in res["runs"]:
        stops = sorted(g["stopped_at"] for g in grid_rows(r["grid"]))
        assert stops == [5] * 6 + [14] * 2 + [42]
        chosen = [g for g in grid_rows(r["grid"]) if g["hparams"] == r["hparams"]]
        assert len(chosen) == 1 and chosen[0]["stopped_at"] == 42  # chosen among the heads at the budget
    on_disk = json.loads((tmp_path / "run" / "results.json").read_text())
    assert on_disk["budget"]["search"] == res["budget"]["search"]


def test_full_is_unchanged_part_key_and_fields(tmp_path: Path) -> None:
    """``full`` keeps the part keys of before the setting; results.json has no rungs and records the search."""
    cfg = config_from_settings(BUNDLED, tmp_path / "x", ["ce", "mr2", "lff", "cdb", "group_dro"], [0, 1],
                               values={"min_steps": 40, "epochs": 1, "device": "cpu"}, progress=False)
    assert cfg.train.search == "full" and "search" not in _keyed_train(cfg.train.__dict__)
    assert _config_key(cfg, content_sha256(BUNDLED)) == "2f60aca847b1bcee"  # the key made before `search` existed
    halving = replace(cfg, train=replace(cfg.train, search="halving"))
    assert _config_key(halving, content_sha256(BUNDLED)) != "2f60aca847b1bcee"
    feats = write_by_hand(tmp_path / "f.h5", k=4, d=8, n_train=448, n_test=80, val=True)
    res = run_experiment(_experiment(feats, tmp_path / "run", "full", null=False))
    assert "search" not in res["budget"] and res["config"]["train"]["search"] == "full"
    assert all("stopped_at" not in g for r in res["runs"] for g in grid_rows(r["grid"]))


def test_halving_chooses_the_full_grids_head_when_it_is_best_early(tmp_path: Path) -> None:
    """lr 3e-2 separates these Gaussians within a few steps, 1e-4 and 1e-3 do not: both searches pick it, and
    with the same weight decay (its head trains identically until the rungs, alone after them)."""
    feats = write_by_hand(tmp_path / "f.h5", k=4, d=8, n_train=448, n_test=80, val=True)
    full = run_experiment(_experiment(feats, tmp_path / "full", "full", null=False))
    half = run_experiment(_experiment(feats, tmp_path / "half", "halving", null=False))
    for a, b in zip(full["runs"], half["runs"]):
        assert (a["method"], a["seed"]) == (b["method"], b["seed"])
        assert a["hparams"]["lr"] == 3e-2 and a["hparams"] == b["hparams"]
        assert b["test_acc"] == pytest.approx(a["test_acc"], abs=0.02)


@pytest.mark.parametrize("rule", ["floor", "checkpoints"])
def test_stateless_methods_rebuilt_for_the_survivors_train_them_as_the_padded_stack_does(
        rule: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """At a cut, a stateless method (ce, mr2, LDAM with its deferred re-weighting, class-balanced) is rebuilt for its
    survivors, so its loss no longer computes the stopped heads; a stateful one (Group DRO) keeps every head, the
    stopped ones as zeros. Every head ends with the same parameters, the same method info and the same stop as when
    no method is rebuilt."""
    from mr2probe.methods import Method

    d = _gauss()
    data = TrainData(d.x.double(), d.y, d.val_x.double(), d.val_y, d.num_classes)
    extra = dict(budget_rule="checkpoints", max_steps=84) if rule == "checkpoints" else {}
    cfg = _cfg(method_params={"ldam": {"drw_frac": 0.5}}, **extra)
    specs = expand_runs(["ce", "mr2", "ldam", "class_balanced", "group_dro"], [0], cfg)
    built: list[tuple[str, int]] = []
    init = Method.__init__

    def counting(self: Method, hparams, ctx) -> None:
        init(self, hparams, ctx)
        built.append((type(self).__name__, len(hparams)))

    monkeypatch.setattr(Method, "__init__", counting)
    rebuilt = train_stack(data, specs, cfg)
    # built once each (9 or 18 grid points), then again for ⌈n/3⌉ and ⌈n/9⌉ survivors; group_dro never again
    assert built == [("CrossEntropy", 9), ("ClassBalanced", 18), ("GroupDRO", 9), ("LDAM", 9), ("MR2", 18),
                     ("CrossEntropy", 3), ("ClassBalanced", 6), ("LDAM", 3), ("MR2", 6),
                     ("CrossEntropy", 1), ("ClassBalanced", 2), ("LDAM", 1), ("MR2", 2)]
    monkeypatch.setattr(Method, "stateless", lambda self: False)
    padded = train_stack(data, specs, cfg)
    assert rebuilt.stopped_at == padded.stopped_at and rebuilt.checkpoint_step == padded.checkpoint_step
    for k, v in padded.probe.state_dict().items():
        torch.testing.assert_close(rebuilt.probe.state_dict()[k], v, rtol=1e-12, atol=1e-12)
    assert json.dumps(rebuilt.info) == json.dumps(padded.info)
