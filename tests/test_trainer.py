"""The stacked trainer: a head trained in a stack equals the head trained alone; determinism; val split."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import write_by_hand
from mr2probe.experiment import ExperimentConfig, holdout_val, run_experiment
from mr2probe.heads import ProbeConfig
from mr2probe.trainer import TrainConfig, TrainData, chunk_size, expand_runs, head_chunks, train_stack


def _data() -> TrainData:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(90, 5, generator=g, dtype=torch.float64)
    y = torch.arange(90) % 3
    x = x + y[:, None].double()
    return TrainData(x, y, x[:15], y[:15], 3)


def _cfg(adapter: str = "none", head: str = "linear") -> TrainConfig:
    return TrainConfig(epochs=3, batch_size=16, lr=(1e-2, 3e-2), wd=(0.0, 0.1), min_steps=0,
                       scale=(16.0, 32.0), probe=ProbeConfig(head=head, adapter=adapter, width=4), progress=False)


def _check_stack_equals_solo(adapter: str, head: str) -> None:
    data, cfg = _data(), _cfg(adapter, head)
    specs = expand_runs(["ce", "mr2"], [7], cfg)
    scales = 2 if head == "cosine" else 1  # the cosine scale is a grid axis
    lams = 4 if adapter != "none" else 1  # MR2's λ is searched only with a trainable adapter
    assert len(specs) == scales * (4 + 8 * lams)  # lr × wd for ce; lr × wd × c̄ (× λ) for mr2
    stack = train_stack(data, specs, cfg)
    for i, spec in enumerate(stack.specs):
        alone = train_stack(data, [spec], cfg)
        for name, p in stack.probe.state_dict().items():
            torch.testing.assert_close(p[i:i + 1], alone.probe.state_dict()[name], rtol=1e-9, atol=1e-9)


def test_stack_equals_solo_linear_no_adapter() -> None:
    _check_stack_equals_solo("none", "linear")


def test_stack_equals_solo_cosine_mlp_adapter() -> None:
    _check_stack_equals_solo("mlp", "cosine")


def test_head_chunks_pack_whole_methods_and_split_only_a_method_larger_than_a_chunk() -> None:
    cfg = _cfg()
    specs = sorted(expand_runs(["ce", "jtt", "logit_adjust"], [0], cfg), key=lambda s: s.method)  # 4, 8, 4 heads
    sizes = [[(m, len(list(g))) for m, g in itertools.groupby(c, key=lambda s: s.method)]
             for c in head_chunks(specs, 5)]
    assert sizes == [[("ce", 4)], [("jtt", 5)], [("jtt", 3)], [("logit_adjust", 4)]]
    assert [len(c) for c in head_chunks(specs, 12)] == [12, 4]
    assert [s for c in head_chunks(specs, 5) for s in c] == specs
    # K = 1000, B = 512: 2 MiB of float32 logits per head → 8 heads in 16 MiB; a GPU keeps one stack
    big = TrainConfig(batch_size=512)
    assert chunk_size(big, 1000, torch.device("cpu")) == 8 and chunk_size(big, 1000, torch.device("cuda")) is None
    assert chunk_size(TrainConfig(chunk_mib=0), 1000, torch.device("cpu")) is None
    # float64 halves it; an adapter's activations count too: K = 744 + d = 256 per head, MLP twice d
    assert chunk_size(big, 1000, torch.device("cpu"), itemsize=8) == 4
    mlp = TrainConfig(batch_size=512, probe=ProbeConfig(adapter="mlp", width=256))
    assert chunk_size(TrainConfig(batch_size=512, probe=ProbeConfig(adapter="linear")), 744, torch.device("cpu")) == 8
    assert chunk_size(mlp, 488, torch.device("cpu")) == 8 and chunk_size(mlp, 1000, torch.device("cpu")) == 5


def test_chunked_stack_equals_one_stack() -> None:
    """Heads trained in chunks of 3 (methods cut, JTT's first stage and MR2's statistics per chunk) end where one
    stack of all of them ends, in the same order, with the same per-head info."""
    data = _data()
    one = TrainConfig(**{**_cfg().__dict__, "chunk_mib": 0})
    chunked = TrainConfig(**{**_cfg().__dict__, "chunk_mib": 3 * 16 * 3 * 8 / 2**20})  # 3 heads of [16, 3] float64
    assert chunk_size(chunked, 3, torch.device("cpu"), itemsize=8) == 3
    specs = expand_runs(["ce", "jtt", "mr2"], [5], one)
    a, b = train_stack(data, specs, one), train_stack(data, specs, chunked)
    assert a.specs == b.specs and a.probe.num_heads == b.probe.num_heads == len(specs)
    for name, p in a.probe.state_dict().items():
        torch.testing.assert_close(b.probe.state_dict()[name], p, rtol=1e-9, atol=1e-9)
    assert [i.keys() for i in a.info] == [i.keys() for i in b.info]
    np.testing.assert_allclose([i.get("margins", [0])[0] for i in a.info], [i.get("margins", [0])[0] for i in b.info])


def test_seed_changes_init_and_order() -> None:
    data, cfg = _data(), _cfg()
    a = train_stack(data, expand_runs(["ce"], [0], cfg)[:1], cfg).probe.head_W
    b = train_stack(data, expand_runs(["ce"], [1], cfg)[:1], cfg).probe.head_W
    assert not torch.equal(a, b)


def test_holdout_val_is_stratified_and_disjoint() -> None:
    y = np.repeat(np.arange(4), [10, 20, 30, 5])
    tr, va = holdout_val(y, 0.1, 0)
    assert len(np.intersect1d(tr, va)) == 0 and len(tr) + len(va) == len(y)
    assert np.bincount(y[va]).tolist() == [1, 2, 3, 1]
    tr2, va2 = holdout_val(y, 0.1, 0)
    assert np.array_equal(va, va2)
    # ⌈f·n⌉ without floating-point excess: 0.07 · 100 is 7.000000000000001 in floats, 7 rows are held out
    assert len(holdout_val(np.zeros(100, dtype=int), 0.07, 0)[1]) == 7


def test_hand_written_file_trains_deterministically(tmp_path: Path) -> None:
    f = write_by_hand(tmp_path / "hand.h5", k=5, n_train=200, n_test=100)
    tcfg = TrainConfig(epochs=4, batch_size=32, min_steps=0, progress=False)
    outs = []
    for name in ("a", "b"):
        cfg = ExperimentConfig(features=f, out=tmp_path / name, methods=["ce", "mr2"], seeds=[0, 1], train=tcfg)
        res = run_experiment(cfg)
        outs.append(json.loads((tmp_path / name / "results.json").read_text())["runs"])
    assert [r["per_class_acc"] for r in outs[0]] == [r["per_class_acc"] for r in outs[1]]
    assert [r["hparams"] for r in outs[0]] == [r["hparams"] for r in outs[1]]
    assert {(r["method"], r["seed"]) for r in res["runs"]} == {("ce", 0), ("ce", 1), ("mr2", 0), ("mr2", 1),
                                                             ("ce (null)", 2), ("ce (null)", 3)}
    mr2 = [r for r in res["runs"] if r["method"] == "mr2"][0]
    assert len(mr2["margins"]) == 5 and abs(np.mean(mr2["margins"]) - mr2["hparams"]["c_bar"]) < 1e-4
    assert res["provenance"]["splits"]["val"] == 20 and res["provenance"]["features_sha256"]
    assert res["provenance"]["device_name"] and res["provenance"]["cpu_count"] >= 1
    ce = [r for r in res["runs"] if r["method"] == "ce"][0]
    assert ce["test_acc"] > 0.45  # well above chance (0.2) on the toy classes


def test_stacked_adamw_is_torch_adamw_per_head() -> None:
    """Each head of a StackedAdamW moves as torch.optim.AdamW with its own lr and weight decay under the
    cosine schedule (float64; the two compute the same formula in a different order of operations)."""
    import math

    from mr2probe.optim import StackedAdamW

    g = torch.Generator().manual_seed(0)
    lrs, wds, steps = [1e-2, 3e-3], [1e-1, 0.0], 7
    w0 = torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    grads = torch.randn(steps, 2, 3, 4, generator=g, dtype=torch.float64)
    stacked = w0.clone().requires_grad_()
    opt = StackedAdamW([([stacked], torch.tensor(lrs, dtype=torch.float64), torch.tensor(wds, dtype=torch.float64))],
                       total_steps=steps)
    for t in range(steps):
        stacked.grad = grads[t].clone()
        opt.step()
    for h in range(2):
        solo = w0[h].clone().requires_grad_()
        ref = torch.optim.AdamW([solo], lr=lrs[h], weight_decay=wds[h])
        sched = torch.optim.lr_scheduler.LambdaLR(ref, lambda t: 0.5 * (1 + math.cos(math.pi * min(t, steps) / steps)))
        for t in range(steps):
            solo.grad = grads[t, h].clone()
            ref.step()
            sched.step()
        assert torch.allclose(stacked[h].detach(), solo.detach(), rtol=1e-12, atol=1e-14)
        assert not torch.equal(stacked[h].detach(), w0[h])


def test_finished_seeds_are_keyed_by_feature_content(tmp_path: Path) -> None:
    """A re-extracted file with the same features and labels but another timestamp reuses the finished seeds;
    changed features do not; parts keyed by the file hash (earlier versions) are adopted, not retrained."""
    import shutil

    import h5py

    from mr2probe.experiment import _config_key
    from mr2probe.featurestore import content_sha256, file_sha256

    first = write_by_hand(tmp_path / "a.h5", k=3, n_train=60, n_test=30)
    again = tmp_path / "b.h5"
    shutil.copy(first, again)
    with h5py.File(again, "r+") as f:
        f.attrs["created_utc"] = "2026-06-01T00:00:00+00:00"
    changed = tmp_path / "c.h5"
    shutil.copy(first, changed)
    with h5py.File(changed, "r+") as f:
        f["train/features"][0, 0] += 1.0
    assert file_sha256(first) != file_sha256(again)
    assert content_sha256(first) == content_sha256(again) != content_sha256(changed)

    tcfg = TrainConfig(epochs=2, batch_size=16, min_steps=0, progress=False)
    out = tmp_path / "run"

    def run(features: Path) -> tuple[dict, dict[str, int]]:
        cfg = ExperimentConfig(features=features, out=out, methods=["ce"], seeds=[0], train=tcfg)
        res = run_experiment(cfg)
        return res, {p.name: p.stat().st_mtime_ns for p in (out / "parts").iterdir()}

    res_a, parts_a = run(first)
    written = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    res_b, parts_b = run(again)
    assert parts_b == parts_a  # the same part files, untouched: seed 0 was not trained again
    # the same numbers from the same parts: the finished folder is kept byte for byte (its first provenance too)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == written
    assert res_b == json.loads(json.dumps(res_a, default=str))  # results.json as the first run wrote it
    assert res_b["provenance"]["features_content_sha256"] == res_a["provenance"]["features_content_sha256"]
    _, parts_c = run(changed)
    assert len(parts_c) == 2 * len(parts_a)  # new features: trained, beside the old part

    # a part written under the legacy key (file sha256) is renamed to the content key and reused
    cfg = ExperimentConfig(features=first, out=out, methods=["ce"], seeds=[0], train=tcfg)
    new_key, legacy = _config_key(cfg, content_sha256(first)), _config_key(cfg, file_sha256(first))
    for ext in ("json", "npz"):
        (out / "parts" / f"seed0-{new_key}.{ext}").rename(out / "parts" / f"seed0-{legacy}.{ext}")
    res_d, parts_d = run(first)
    assert f"seed0-{new_key}.json" in parts_d and f"seed0-{legacy}.json" not in parts_d
    assert any("older mr2probe" in n for n in res_d["notes"]) and res_d["runs"] == res_a["runs"]


def test_diverged_training_is_one_user_error_read_without_a_sync_per_step() -> None:
    """A learning rate that overflows the logits ends training with UserError; finiteness is read from the device
    every FINITE_EVERY steps and at each epoch's end (here: at the end of the first epoch, before step 64)."""
    from mr2probe.errors import UserError
    from mr2probe.trainer import FINITE_EVERY

    d = _data()
    data = TrainData(d.x.float(), d.y, d.val_x.float(), d.val_y, d.num_classes)  # float32: 1e38 overflows
    cfg = TrainConfig(epochs=2, batch_size=16, lr=(1e38,), wd=(0.0,), min_steps=0, progress=False)
    assert len(data.y) // cfg.batch_size < FINITE_EVERY
    with pytest.raises(UserError, match=r"training diverged \(a non-finite loss by epoch 1\); lower --lr"):
        train_stack(data, expand_runs(["ce"], [0], cfg), cfg)
    ok = TrainConfig(epochs=2, batch_size=16, lr=(1e-2,), wd=(0.0,), min_steps=0, progress=False)
    assert np.isfinite(train_stack(data, expand_runs(["ce"], [0], ok), ok).probe.head_W.detach().numpy()).all()


@pytest.mark.parametrize("head,adapter", [("linear", "none"), ("cosine", "none"), ("linear", "mlp"),
                                          ("cosine", "linear")])
def test_the_logits_of_some_heads_are_the_stacks_rows(head: str, adapter: str) -> None:
    """``ProbeStack.logits(x, heads)`` evaluates only those heads' adapters and classifiers, with the rows of the
    whole stack's forward; ``represent(x, heads)`` likewise (shared [1, B, D] without an adapter)."""
    from mr2probe.heads import ProbeStack

    x = torch.randn(7, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    stack = ProbeStack(ProbeConfig(head=head, adapter=adapter, width=4), 5, 3, [0, 1, 2, 3],
                       [8.0, 16.0, 4.0, 2.0]).double()
    z, logits = stack(x)
    for sl in (slice(1, 3), slice(0, 4), slice(3, 4)):
        torch.testing.assert_close(stack.logits(x, sl), logits[sl], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(stack.represent(x, sl), z if z.shape[0] == 1 else z[sl], rtol=1e-12, atol=1e-12)
