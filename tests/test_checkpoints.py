"""The checkpoints budget rule: one run per seed stack to the largest checkpoint F·2ⁱ ≤ max_steps (F the floor
budget) under a cosine schedule with warm restarts ending at the checkpoints; every head keeps its best
checkpoint on val, so each method's budget is selected on val like lr; recorded in results.json; its own part keys."""
from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, replace
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from conftest import run_cli
from mr2probe.errors import UserError
from mr2probe.experiment import ExperimentConfig, _config_key, _keyed_train, config_from_settings, run_experiment
from mr2probe.jsonfile import grid_rows
from mr2probe.optim import StackedAdamW, cosine_restarts
from mr2probe.trainer import (TrainConfig, TrainData, checkpoint_steps, expand_runs, select_scores, train_stack,
                              train_steps)

# 205 training rows (200 + 5 under longtail:40), batch 64: 4 steps per epoch; min_steps 5 → 2 epochs, F = 8 steps
SMALL = {"epochs": 1, "min_steps": 5, "batch_size": 64, "wd": (0.0,), "select": "macc"}


def write_longtail_source(path: Path, d: int = 20, mu: float = 1.5, n: int = 200, seed: int = 0) -> Path:
    """Two overlapping Gaussian classes (means ∓mu·e₀, unit covariance, d dims), n per class in every split; the
    profile longtail:40 leaves 200 and 5 for training. With 5 tail samples the training set is separable, so long
    training drives a linear head toward the max-margin direction, where additive logit offsets lose their effect
    (Byrd & Lipton 2019) and the tail's val accuracy falls."""
    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        f.attrs.update({"format": "mr2probe.features", "format_version": 1, "encoder": "hand", "dataset": "gauss",
                        "class_names": json.dumps(["head", "tail"])})
        for split in ("train", "val", "test"):
            y = np.arange(2 * n) % 2
            x = rng.normal(0, 1, size=(2 * n, d))
            x[:, 0] += np.where(y == 0, -mu, mu)
            g = f.create_group(split)
            g.create_dataset("features", data=x.astype(np.float32))
            g.create_dataset("labels", data=y.astype(np.int64))
            g.create_dataset("index", data=np.arange(2 * n, dtype=np.int64))
            g.attrs["complete"] = True
    return path


@pytest.fixture
def lt_file(tmp_path: Path) -> Path:
    return write_longtail_source(tmp_path / "lt.h5")


def _longtail_data(seed: int = 0) -> TrainData:
    """The file's data as longtail:40 leaves it, in memory: 200 head and 5 tail training rows, balanced val."""
    rng = np.random.default_rng(seed)

    def draw(counts: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        y = np.repeat([0, 1], counts)
        x = rng.normal(0, 1, size=(len(y), 20))
        x[:, 0] += np.where(y == 0, -1.5, 1.5)
        return torch.tensor(x, dtype=torch.float32), torch.tensor(y)

    x, y = draw((200, 5))
    vx, vy = draw((200, 200))
    return TrainData(x, y, vx, vy, 2)


def _cfg(**kw) -> TrainConfig:
    base = dict(epochs=1, min_steps=5, batch_size=64, lr=(1e-2, 1e-1, 3e-1), wd=(0.0, 1e-1),
                budget_rule="checkpoints", max_steps=64, progress=False)
    return TrainConfig(**{**base, **kw})


def test_cosine_restarts_at_and_around_the_cycle_ends() -> None:
    """Ends 4, 8, 16 (cycles 4, 4, 8): f = 1 at each restart, ½(1 + cos(π·(t − start)/L)) inside, 0 from the end."""
    ends = [4, 8, 16]
    hand = {0: 1.0, 1: (2 + math.sqrt(2)) / 4, 2: 0.5, 3: (2 - math.sqrt(2)) / 4,  # cycle 1: L = 4
            4: 1.0, 5: (2 + math.sqrt(2)) / 4, 6: 0.5, 7: (2 - math.sqrt(2)) / 4,  # cycle 2 restarts at 4: L = 4
            8: 1.0, 9: 0.5 * (1 + math.cos(math.pi / 8)), 12: 0.5, 15: 0.5 * (1 - math.cos(math.pi / 8)),  # L = 8
            16: 0.0, 17: 0.0, 100: 0.0}
    for t, want in hand.items():
        assert cosine_restarts(t, ends) == pytest.approx(want, abs=1e-15), t
    assert cosine_restarts(15, ends) == pytest.approx(0.0380602337443566, abs=1e-15)  # ≈ 0: annealed at the end
    # one cycle is the plain cosine schedule, bit for bit (floor runs are unchanged)
    assert all(cosine_restarts(t, [7]) == 0.5 * (1.0 + math.cos(math.pi * min(t, 7) / 7)) for t in range(10))


def test_stacked_adamw_steps_follow_the_restarted_schedule() -> None:
    """With zero gradients AdamW only decays: θ_T = θ₀ · Π_t (1 − η f(t) λ), per head its own η and λ."""
    lr = torch.tensor([1e-1, 3e-2], dtype=torch.float64)
    wd = torch.tensor([0.5, 2.0], dtype=torch.float64)
    w = torch.ones(2, 3, dtype=torch.float64)
    opt = StackedAdamW([([w], lr, wd)], cycle_ends=[3, 6, 12])
    for _ in range(14):  # two steps past the last end: f = 0, no step
        w.grad = torch.zeros_like(w)
        opt.step()
    f = torch.tensor([cosine_restarts(t, [3, 6, 12]) for t in range(14)], dtype=torch.float64)
    want = torch.prod(1 - lr[:, None] * f[None] * wd[:, None], dim=1)
    torch.testing.assert_close(w, want[:, None].expand(2, 3), rtol=1e-14, atol=0)
    assert opt.total_steps == 12
    with pytest.raises(ValueError):
        StackedAdamW([([w], lr, wd)], cycle_ends=[4, 4])


def test_the_checkpoints_are_the_floor_doubled_up_to_max_steps() -> None:
    cfg = _cfg()
    assert checkpoint_steps(205, cfg) == [8, 16, 32, 64] and train_steps(205, cfg) == 64
    assert checkpoint_steps(205, replace(cfg, max_steps=63)) == [8, 16, 32]
    assert checkpoint_steps(205, replace(cfg, max_steps=8)) == [8]
    assert checkpoint_steps(2000, replace(cfg, epochs=3, max_steps=1000)) == [96, 192, 384, 768]  # 32 × 3 epochs
    assert train_steps(205, replace(cfg, budget_rule="floor")) == 8
    with pytest.raises(UserError, match="--max-steps 7 is below the floor budget of 8 steps"):
        checkpoint_steps(205, replace(cfg, max_steps=7))


def test_each_head_keeps_its_best_checkpoint_and_its_state_from_then() -> None:
    """Every head's restored state scores on val what its best checkpoint scored (the first best on ties); it is
    the state of a run that stops at that checkpoint (the schedule and data order up to it are the same), and at
    the first checkpoint the floor rule's model."""
    data, cfg = _longtail_data(seed=1), _cfg(lr=(3e-1, 1.0, 3.0))  # large steps: some heads peak at the first
    specs = expand_runs(["ce", "logit_adjust"], [0], cfg)
    trained = train_stack(data, specs, cfg, select="macc")
    ckpts, scores, steps = trained.checkpoints, trained.checkpoint_scores, np.array(trained.checkpoint_step)
    assert ckpts == [8, 16, 32, 64] and scores.shape == (4, len(specs))
    restored = select_scores(trained.predict(data.val_x), data.val_y, 2, "macc")
    np.testing.assert_array_equal(restored, scores.max(0))
    np.testing.assert_array_equal(steps, np.array(ckpts)[scores.argmax(0)])  # argmax: the first on ties
    assert (steps < ckpts[-1]).any() and (steps == ckpts[0]).any()  # heads whose val score peaked early
    for s in sorted(set(steps) - {ckpts[-1]}):
        stop = train_stack(data, specs, replace(cfg, max_steps=int(s)), select="macc")
        heads = np.flatnonzero(steps == s)
        for name, p in trained.probe.state_dict().items():
            torch.testing.assert_close(p[heads], stop.probe.state_dict()[name][heads], rtol=0, atol=0)
    floor = train_stack(data, specs, replace(cfg, budget_rule="floor"))
    np.testing.assert_array_equal(select_scores(floor.predict(data.val_x), data.val_y, 2, "macc"), scores[0])
    assert floor.checkpoint_step is None and floor.checkpoint_scores is None
    first = np.flatnonzero(steps == ckpts[0])
    for name, p in trained.probe.state_dict().items():
        torch.testing.assert_close(p[first], floor.probe.state_dict()[name][first], rtol=0, atol=0)


def test_cpu_chunks_give_the_same_checkpoints() -> None:
    data, cfg = _longtail_data(), _cfg()
    specs = expand_runs(["ce", "logit_adjust"], [0], cfg)
    one = train_stack(data, specs, cfg, select="macc")
    chunked = train_stack(data, specs, replace(cfg, chunk_mib=64 * 2 * 4 * 5 / 2**20), select="macc")  # 5 heads
    np.testing.assert_array_equal(one.checkpoint_scores, chunked.checkpoint_scores)
    assert one.checkpoint_step == chunked.checkpoint_step and one.checkpoints == chunked.checkpoints


def _run(features: Path, out: Path, methods: list[str], seeds: list[int], **values) -> dict:
    cfg = config_from_settings(features, out, methods, seeds, values={**SMALL, "budget_rule": "checkpoints",
                                                                      **values},
                               profile="longtail:40", progress=False)
    return run_experiment(cfg)


def test_results_record_the_checkpoints_and_each_runs_choice(tmp_path: Path, lt_file: Path) -> None:
    res = _run(lt_file, tmp_path / "run", ["ce", "logit_adjust", "logreg"], [0, 1], lr=(1e-2, 1e-1), max_steps=40)
    budget = res["budget"]
    assert budget["checkpoints"] == [8, 16, 32] and budget["floor_steps"] == 8 and budget["max_steps"] == 40
    assert budget["steps"] == 32 and budget["epochs"] == 8 and budget["steps_per_epoch"] == 4
    assert budget["rule"].startswith("one run per seed stack")
    assert res["config"]["train"]["budget_rule"] == "checkpoints"
    stacked = [r for r in res["runs"] if r["method"] != "logreg"]
    assert {r["method"] for r in stacked} == {"ce", "logit_adjust", "ce (null)"} and len(stacked) == 6
    for r in stacked:
        vals = r["checkpoint_val_scores"]
        assert len(vals) == 3 and r["checkpoint_step"] == budget["checkpoints"][int(np.argmax(vals))]
        assert r["val_score"] == max(vals)  # the restored head scores what its best checkpoint scored
        assert all(g["checkpoint_step"] in budget["checkpoints"] for g in grid_rows(r["grid"]))
        assert r["val_score"] == max(g["val_score"] for g in grid_rows(r["grid"]))
    logreg = next(r for r in res["runs"] if r["method"] == "logreg")
    assert "checkpoint_step" not in logreg and "checkpoint_val_scores" not in logreg
    on_disk = json.loads((tmp_path / "run" / "results.json").read_text())
    assert on_disk["budget"]["checkpoints"] == [8, 16, 32] and on_disk["runs"][0]["checkpoint_step"] in (8, 16, 32)


def test_a_method_whose_val_score_falls_with_training_gets_an_earlier_checkpoint(tmp_path: Path,
                                                                                  lt_file: Path) -> None:
    """Logit adjustment on a long-tailed, separable training set: its offsets help early, and longer training
    erodes them (the head drifts toward the max-margin direction). Its mean per-class val accuracy peaks before
    the last checkpoint and falls by more than a point after; the rule keeps the peak, on every seed."""
    res = _run(lt_file, tmp_path / "la", ["logit_adjust"], [0, 1, 2], lr=(1e-1,), max_steps=512, null=False)
    assert res["budget"]["checkpoints"] == [8, 16, 32, 64, 128, 256, 512]
    for r in res["runs"]:
        vals = r["checkpoint_val_scores"]
        assert r["checkpoint_step"] < 512 and vals[-1] < max(vals) - 0.01, vals


def test_part_keys_hold_the_rule_and_floor_keys_are_unchanged(tmp_path: Path, lt_file: Path) -> None:
    """Parts of another rule are never mixed in; floor keys are those made before the rule existed."""
    cfg = ExperimentConfig(features=Path("f.h5"), out=Path("o"))
    assert _config_key(cfg, "0" * 64) == "d80617b642cce781"  # the key of this config before the checkpoints rule
    assert not {"budget_rule", "max_steps"} & set(_keyed_train(asdict(cfg.train)))
    keys = {rule: _config_key(replace(cfg, train=replace(cfg.train, budget_rule=rule)), "0" * 64)
            for rule in ("floor", "reach-logreg", "checkpoints")}
    assert len(set(keys.values())) == 3 and keys["floor"] == "d80617b642cce781"
    ck = replace(cfg, train=replace(cfg.train, budget_rule="checkpoints"))
    assert _config_key(ck, "0" * 64) != _config_key(replace(ck, train=replace(ck.train, max_steps=64)), "0" * 64)
    # one folder, both rules: the checkpoints run trains its own parts, then a rerun of it trains nothing
    out = tmp_path / "both"
    floor = _run(lt_file, out, ["ce"], [0], budget_rule="floor", null=False)
    assert "checkpoints" not in floor["budget"] and "checkpoint_step" not in floor["runs"][0]
    _run(lt_file, out, ["ce"], [0], max_steps=32, null=False)
    assert len(list((out / "parts").glob("seed0-*.json"))) == 2
    before = (out / "results.json").read_bytes()
    again = _run(lt_file, out, ["ce"], [0], max_steps=32, null=False)
    assert again["budget"]["checkpoints"] == [8, 16, 32] and (out / "results.json").read_bytes() == before


def test_streamed_features_train_with_checkpoints(tmp_path: Path, lt_file: Path) -> None:
    res = _run(lt_file, tmp_path / "stream", ["ce", "logit_adjust"], [0], max_steps=32, max_memory=20_000,
               null=False)
    assert res["provenance"]["features_in_memory"] is False
    for r in res["runs"]:
        assert r["val_score"] == max(r["checkpoint_val_scores"]) and r["checkpoint_step"] in (8, 16, 32)


def test_max_steps_below_the_floor_is_one_line(tmp_path: Path, lt_file: Path) -> None:
    out = tmp_path / "bad"
    r = run_cli("train", "--features", str(lt_file), "--out", str(out), "-q", "--methods", "ce", "--epochs", "1",
                "--min-steps", "5", "--batch-size", "64", "--train-profile", "longtail:40",
                "--budget-rule", "checkpoints", "--max-steps", "7")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--max-steps 7 is below the floor budget of 8 steps" in r.stderr
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="torchrun with gloo on loopback")
def test_two_ranks_equal_one_process(tmp_path: Path, lt_file: Path) -> None:
    """Each rank trains whole seed stacks, checkpoints included: the same results as one process."""
    from test_torchrun import mr2probe

    def comparable(run_dir: Path) -> dict:
        res = json.loads((run_dir / "results.json").read_text())
        return {"budget": res["budget"], "runs": [{k: v for k, v in r.items() if not k.endswith("wall_time_s")}
                                                  for r in res["runs"]]}

    args = ["--methods", "ce,logit_adjust", "--seeds", "2", "--epochs", "1", "--min-steps", "5", "--batch-size",
            "64", "--lr", "1e-1", "--train-profile", "longtail:40", "--budget-rule", "checkpoints", "--max-steps",
            "32", "--no-null", "-q"]
    one, two = tmp_path / "one", tmp_path / "two"
    r1 = mr2probe("train", "--features", str(lt_file), "--out", str(one), *args)
    r2 = mr2probe("train", "--features", str(lt_file), "--out", str(two), *args, ranks=2)
    assert r1.returncode == 0 and r2.returncode == 0, r1.stderr + r2.stderr
    a, b = comparable(one), comparable(two)
    assert a["runs"] == b["runs"] and a["budget"] == b["budget"] and a["budget"]["checkpoints"] == [8, 16, 32]
