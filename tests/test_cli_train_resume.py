"""`mr2probe train` as a user runs it: SIGKILL and resume, Ctrl-C, determinism through the CLI (bad input: in
test_cli_errors.py).

Training runs are subprocesses (`python -m mr2probe train`) on a hand-written feature file sized so that one
seed takes about a second here; extraction's kill/resume and Ctrl-C are in test_extract_engine.py.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, write_by_hand
from mr2probe.predfile import load_predictions

WALL_KEYS = {"stack_wall_time_s", "wall_time_s", "command"}  # differ between identical runs


def env() -> dict[str, str]:
    """One thread (the same numerics in every run; the machine is shared), wide lines, unbuffered."""
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", COLUMNS="200", PYTHONUNBUFFERED="1")


@pytest.fixture(scope="module")
def features(tmp_path_factory) -> Path:
    """5 overlapping Gaussian classes, D=32, 2000 train / 500 test rows: one seed of ce+mr2 (40 epochs) takes
    about a second here, a window wide enough to kill the run between two seeds."""
    return write_by_hand(tmp_path_factory.mktemp("hardening") / "f.h5", k=5, d=32, n_train=2000, n_test=500)


def train_args(features: Path, out: Path, seeds: int = 3, epochs: int = 40) -> list[str]:
    return [sys.executable, "-m", "mr2probe", "train", "--features", str(features), "--out", str(out),
            "--seeds", str(seeds), "--epochs", str(epochs), "--methods", "ce,mr2", "--batch-size", "64",
            "--lr", "1e-2", "--wd", "1e-4", "-q"]


def run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env(), timeout=600)


def start(args: list[str]) -> subprocess.Popen:
    """In its own session, so that a signal to its process group reaches it as Ctrl-C in a terminal does; with
    SIGINT's default action even where pytest itself runs with SIGINT ignored (a background job of a
    non-interactive shell, nohup), which the child would inherit and Python would then keep."""
    return subprocess.Popen(args, cwd=ROOT, env=env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def wait_for(pred, proc: subprocess.Popen, timeout: float = 300) -> None:
    t0 = time.monotonic()
    while not pred():
        if proc.poll() is not None:
            raise AssertionError(f"exited early (rc {proc.returncode}): {proc.communicate()[1][-2000:]}")
        if time.monotonic() - t0 > timeout:
            raise AssertionError("timed out")
        time.sleep(0.02)


def without_wall_times(obj):
    """``obj`` with the fields that differ between identical runs removed (recursively)."""
    if isinstance(obj, dict):
        return {k: without_wall_times(v) for k, v in obj.items() if k not in WALL_KEYS}
    if isinstance(obj, list):
        return [without_wall_times(v) for v in obj]
    return obj


def load_run(out: Path) -> tuple[dict, dict[str, np.ndarray]]:
    return json.loads((out / "results.json").read_text()), load_predictions(out / "predictions.npz")


def assert_same_predictions(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.fixture(scope="module")
def reference(features: Path, tmp_path_factory) -> Path:
    """One uninterrupted run: the comparison for the resumed run and for the determinism test."""
    out = tmp_path_factory.mktemp("reference") / "run"
    r = run(train_args(features, out))
    assert r.returncode == 0, r.stderr[-2000:]
    return out


def parts(out: Path, seed: int) -> list[Path]:
    return sorted((out / "parts").glob(f"seed{seed}-*"))


# ---- 1. SIGKILL and resume --------------------------------------------------------------------------------------

@pytest.mark.slow
def test_sigkill_then_resume_keeps_finished_seed_and_matches_uninterrupted_run(features: Path, reference: Path,
                                                                               tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = start(train_args(features, out))
    try:
        wait_for(lambda: len([p for p in parts(out, 0) if p.suffix in (".json", ".npz")]) == 2, proc)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "results.json").exists() and not (out / "predictions.npz").exists()
    assert not [p for p in parts(out, 2) if p.suffix == ".json"], "the kill came too late: all seeds had finished"
    done = [s for s in range(3) if [p.suffix for p in parts(out, s) if p.suffix in (".json", ".npz")]
            == [".json", ".npz"]]
    finished = {p: p.stat().st_mtime_ns for s in done for p in parts(out, s) if p.suffix in (".json", ".npz")}
    seed1_done = 1 in done

    r = run(train_args(features, out))  # the same command again
    assert r.returncode == 0, r.stderr[-2000:]
    assert "seed 0: already trained" in r.stderr
    assert ("seed 1: already trained" in r.stderr) == seed1_done and "seed 2: already trained" not in r.stderr
    assert {p: p.stat().st_mtime_ns for p in finished} == finished, "a finished seed was written again"
    for seed in (0, 1, 2):
        assert [p.suffix for p in parts(out, seed) if p.suffix in (".json", ".npz")] == [".json", ".npz"]

    resumed, resumed_preds = load_run(out)
    ref, ref_preds = load_run(reference)
    assert without_wall_times(resumed["runs"]) == without_wall_times(ref["runs"])
    assert [(x["method"], x["seed"]) for x in resumed["runs"]] == [(m, s) for m in ("ce", "mr2") for s in range(3)] \
        + [("ce (null)", s) for s in range(3, 6)]
    assert_same_predictions(resumed_preds, ref_preds)
    for key in ("config", "class_names", "test_class_counts", "reference"):
        assert resumed[key] == ref[key], key


# ---- 2. Ctrl-C -----------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_ctrl_c_stops_fast_exit_130_one_line_no_results(features: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = start(train_args(features, out, seeds=5))
    try:
        wait_for(lambda: (out / "parts").is_dir(), proc)  # the command is training (its handler is in place)
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        t0 = time.monotonic()
        _, stderr = proc.communicate(timeout=60)
        stopped_in = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    print(f"stopped {stopped_in:.2f} s after SIGINT")
    assert proc.returncode == 130, stderr[-2000:]
    assert stopped_in < 10
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert [line for line in lines if "interrupt" in line.lower()] == [lines[-1]]
    assert lines[-1].startswith("error: interrupted") and "rerun the same command to resume" in lines[-1]
    left = sorted(p.name for p in out.iterdir())
    assert left == ["parts"], left  # no results.json, predictions.npz or tables
    assert not list((out / "parts").glob("*.tmp"))


# ---- 3. determinism through the CLI ---------------------------------------------------------------------------

@pytest.mark.slow
def test_same_command_twice_gives_identical_results(features: Path, reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "again"
    r = run(train_args(features, out))
    assert r.returncode == 0, r.stderr[-2000:]
    again, again_preds = load_run(out)
    ref, ref_preds = load_run(reference)
    assert without_wall_times(again) == without_wall_times(ref)
    assert_same_predictions(again_preds, ref_preds)
    assert (out / "table.csv").read_text() == (reference / "table.csv").read_text()
