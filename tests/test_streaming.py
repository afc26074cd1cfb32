"""Streaming features larger than --max-memory from the HDF5 file: same results as in memory (statistically),
deterministic, stack == solo, NaN refused, bad sizes refused."""
from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from conftest import run_cli
from mr2probe.errors import UserError
from mr2probe.experiment import ExperimentConfig, run_experiment
from mr2probe.featurestore import read_features
from mr2probe.heads import ProbeConfig
from mr2probe.source import StreamedFeatures, parse_size, resolve_max_memory, stream_layout
from mr2probe.trainer import TrainConfig, TrainData, epoch_batches, expand_runs, train_stack

K, D = 5, 32


def write_file(path: Path, n_train: int = 3000, n_test: int = 1000, nan_row: int | None = None,
               chunks: int | None = None) -> Path:
    """Overlapping Gaussian classes (accuracy well below 100%), float32, written with plain h5py."""
    rng = np.random.default_rng(0)
    centers = rng.normal(0, 0.35, size=(K, D))
    with h5py.File(path, "w") as f:
        f.attrs.update({"format": "mr2probe.features", "format_version": 1, "encoder": "gauss", "dataset": "gauss",
                        "class_names": json.dumps([f"c{i}" for i in range(K)])})
        for split, n in (("train", n_train), ("test", n_test)):
            y = rng.integers(0, K, n)
            x = (centers[y] + rng.normal(0, 1.0, size=(n, D))).astype(np.float32)
            if nan_row is not None and split == "train":
                x[nan_row, 3] = np.nan
            g = f.create_group(split)
            g.create_dataset("features", data=x, chunks=(min(chunks, n), D) if chunks else None)
            g.create_dataset("labels", data=y.astype(np.int64))
            g.create_dataset("index", data=np.arange(n, dtype=np.int64))
            g.attrs["complete"] = True
    return path


def _run(f: Path, out: Path, max_memory: int | str) -> dict:
    cfg = ExperimentConfig(features=f, out=out, methods=["ce", "mr2"], seeds=[0], max_memory=max_memory,
                           train=TrainConfig(epochs=4, batch_size=64, lr=(1e-2,), wd=(1e-4,), min_steps=0,
                                             progress=False))
    return run_experiment(cfg)


def test_stream_matches_memory_and_is_deterministic(tmp_path: Path) -> None:
    f = write_file(tmp_path / "f.h5")
    assert f.stat().st_size > 100_000
    mem = _run(f, tmp_path / "mem", "8GiB")
    streams = [_run(f, tmp_path / f"stream{i}", 100_000) for i in range(2)]
    assert mem["provenance"]["features_in_memory"] is True and mem["provenance"]["stream_block_rows"] is None
    prov = streams[0]["provenance"]
    assert prov["features_in_memory"] is False
    assert 0 < prov["stream_block_rows"] < prov["splits"]["train"]
    assert prov["stream_block_rows"] * D * 4 <= 100_000 / 2 and prov["stream_block_rows"] % 64 == 0
    assert any("streamed from the file" in n for n in streams[0]["notes"])
    for a, b in zip(mem["runs"], streams[0]["runs"]):
        assert a["method"] == b["method"]
        assert 0.5 < a["test_acc"] < 0.98  # a task with errors, so that closeness means something
        assert abs(a["test_acc"] - b["test_acc"]) < 0.03
        assert abs(a["val_score"] - b["val_score"]) < 0.04

    def key(res: dict) -> list:
        return [(x["method"], x["hparams"], x["per_class_acc"], x["val_score"], x.get("margins")) for x in res["runs"]]

    assert key(streams[0]) == key(streams[1])
    assert key(streams[0]) != key(mem)  # another data order
    p0 = np.load(tmp_path / "stream0" / "predictions.npz")
    p1 = np.load(tmp_path / "stream1" / "predictions.npz")
    assert all(np.array_equal(p0[k], p1[k]) for k in p0.files)


def _streamed_train_data(f: Path, h5: h5py.File, block_rows: int, piece_rows: int) -> TrainData:
    fs = read_features(f, load="labels")
    n = len(fs.splits["train"])
    rows = np.flatnonzero(np.arange(n) % 10 != 3)  # a held-out-like subset of the physical rows
    held = np.flatnonzero(np.arange(n) % 10 == 3)
    x = StreamedFeatures(h5["train"]["features"], rows, "cpu", block_rows, piece_rows)
    vx = StreamedFeatures(h5["train"]["features"], held, "cpu", block_rows, piece_rows)
    y = torch.as_tensor(fs.splits["train"].labels)
    return TrainData(x, y[rows], vx, y[held], K)


def test_streamed_features_read_the_right_rows(tmp_path: Path) -> None:
    f = write_file(tmp_path / "f.h5", chunks=100)
    with h5py.File(f, "r") as h5:
        full = h5["train"]["features"][()]
        data = _streamed_train_data(f, h5, block_rows=640, piece_rows=128)
        x, rows = data.x, data.x.rows
        assert len(x) == len(rows) and x.shape == (len(rows), D) and x.dtype == torch.float32
        torch.testing.assert_close(x[10:2000], torch.from_numpy(full[rows[10:2000]]), rtol=0, atol=0)
        torch.testing.assert_close(data.val_x[:], torch.from_numpy(full[data.val_x.rows]), rtol=0, atol=0)
        idx = torch.tensor([5, 2699, 5, 0, 1234])
        torch.testing.assert_close(x[idx], torch.from_numpy(full[rows[idx.numpy()]]), rtol=0, atol=0)
        assert x[5:5].shape == (0, D)
        seen, gen = [], torch.Generator().manual_seed(3)
        batches = list(x.batches(64, gen))
        assert len(batches) == x.num_batches(64) == -(-len(x) // 64)
        for idx, xb in batches:
            torch.testing.assert_close(xb, torch.from_numpy(full[rows[idx.numpy()]]), rtol=0, atol=0)
            assert len(set((idx // 640).tolist())) <= 5  # one block: at most 640/128 pieces
            seen += idx.tolist()
        assert sorted(seen) == list(range(len(x)))
        again = [i for i, _ in x.batches(64, torch.Generator().manual_seed(3))]
        assert all(torch.equal(a, b) for (a, _), b in zip(batches, again))
        with pytest.raises(ValueError, match="multiple"):
            next(x.batches(48, gen))


def test_in_memory_order_unchanged() -> None:
    x = torch.randn(100, 3)
    got = [idx for idx, _ in epoch_batches(x, 16, torch.Generator().manual_seed(5))]
    order = torch.randperm(100, generator=torch.Generator().manual_seed(5))
    assert all(torch.equal(a, order[i * 16:(i + 1) * 16]) for i, a in enumerate(got)) and len(got) == 7


@pytest.mark.parametrize("adapter,head", [("none", "linear"), ("mlp", "cosine")])
def test_stack_equals_solo_streamed(tmp_path: Path, adapter: str, head: str) -> None:
    f = write_file(tmp_path / "f.h5", n_train=1200, n_test=200, chunks=128)
    cfg = TrainConfig(epochs=2, batch_size=64, lr=(1e-2,), wd=(0.0, 0.1), min_steps=0,
                      probe=ProbeConfig(head=head, adapter=adapter, width=8), progress=False)
    with h5py.File(f, "r") as h5:
        data = _streamed_train_data(f, h5, block_rows=256, piece_rows=128)
        specs = expand_runs(["ce", "mr2"], [7], cfg)
        stack = train_stack(data, specs, cfg)
        for i in (0, len(specs) - 1):
            alone = train_stack(data, [stack.specs[i]], cfg)
            for name, p in stack.probe.state_dict().items():
                torch.testing.assert_close(p[i:i + 1], alone.probe.state_dict()[name], rtol=1e-6, atol=1e-6)
        logits = stack.predict(data.val_x)
        assert logits.shape == (len(specs), len(data.val_y), K)


def test_nan_in_streamed_file_is_refused(tmp_path: Path) -> None:
    f = write_file(tmp_path / "nan.h5", nan_row=2222, chunks=256)
    with pytest.raises(UserError, match="NaN or Inf features in 1 rows"):
        read_features(f, load="labels")
    with pytest.raises(UserError, match="NaN"):
        _run(f, tmp_path / "out", 50_000)


def test_sizes() -> None:
    assert parse_size("512MB") == 512 * 10**6 and parse_size("8GiB") == 8 * 2**30 and parse_size(1000) == 1000
    assert parse_size("1.5 kb") == 1500 and parse_size("auto") == "auto" and parse_size("100000") == 100000
    for bad in ("lots", "-5MB", "0", "12XB", ""):
        with pytest.raises(UserError, match="max-memory"):
            parse_size(bad)
    block, piece = stream_layout(100_000, 32, 64, None)
    assert piece % 64 == 0 and block % piece == 0 and block * 32 * 4 <= 50_000
    block, piece = stream_layout(8 * 2**30, 1280, 512, 1024)
    assert piece == 1024 and block == 1024 * (4 * 2**30 // (1280 * 4) // 1024)
    assert stream_layout(1000, 1280, 512, 1024) == (512, 512)  # at least one batch
    assert resolve_max_memory("auto", torch.device("cpu")) > 0 and resolve_max_memory("2KiB", "cpu") == 2048


def test_cli_bad_max_memory(tmp_path: Path) -> None:
    r = run_cli("train", "--features", str(write_file(tmp_path / "f.h5")), "--max-memory", "lots",
                "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "--max-memory" in r.stderr and len(r.stderr.strip().splitlines()) == 1
