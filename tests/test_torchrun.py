"""torchrun: `mr2probe train` and `mr2probe bench` on 2 CPU ranks (gloo) write the same run folders as one process
(equal apart from timings and the world size in provenance); a rank killed mid-run ends the job with one line
per rank and the same command then resumes."""
from __future__ import annotations

import pytest

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from conftest import ROOT, write_by_hand

pytestmark = pytest.mark.slow  # make test-all; make test leaves these out

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
VOLATILE = {"wall_time_s", "command", "world_size", "torch_threads", "features", "features_sha256"}  # the file's
# bytes hold its creation time; features_content_sha256 (the arrays) is compared


def env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")


def mr2probe(*args: str, ranks: int = 1, timeout: float = 600) -> subprocess.CompletedProcess:
    launcher = TORCHRUN[:-1] + [f"--nproc_per_node={ranks}"] if ranks > 1 else [sys.executable]
    return subprocess.run([*launcher, "-m", "mr2probe", *args], cwd=ROOT, env=env(), capture_output=True, text=True,
                          timeout=timeout)


def comparable(run_dir: Path) -> dict:
    res = json.loads((run_dir / "results.json").read_text())
    res["provenance"] = {k: v for k, v in res["provenance"].items() if k not in VOLATILE}
    res["provenance"]["feature_file_attrs"].pop("created_utc")
    res["runs"] = [{k: v for k, v in r.items() if not k.endswith("wall_time_s")} for r in res["runs"]]
    for r in res["runs"]:  # a exact probe's fit time
        r.get("reference_probe", {}).pop("wall_s", None)
    res["config"]["train"].pop("progress")
    return res


def assert_same_run(a: Path, b: Path) -> None:
    ra, rb = comparable(a), comparable(b)
    assert ra == rb
    with np.load(a / "predictions.npz") as za, np.load(b / "predictions.npz") as zb:
        assert sorted(za.files) == sorted(zb.files)
        for k in za.files:
            np.testing.assert_array_equal(za[k], zb[k])
    assert (a / "table.md").read_text() == (b / "table.md").read_text()


def train_args(feats: Path, out: Path) -> list[str]:
    return ["train", "--features", str(feats), "--out", str(out), "--methods", "ce,mr2,focal", "--seeds", "3",
            "--epochs", "2", "--min-steps", "40", "--batch-size", "32", "-q"]


def test_train_two_ranks_equal_one_process(tmp_path: Path) -> None:
    feats = write_by_hand(tmp_path / "f.h5", k=4, d=8, n_train=120, n_test=60)
    one, two = tmp_path / "one", tmp_path / "two"
    r1 = mr2probe(*train_args(feats, one))
    assert r1.returncode == 0, r1.stderr
    r2 = mr2probe(*train_args(feats, two), ranks=2)
    assert r2.returncode == 0, r2.stderr
    assert r2.stdout.count("wrote ") == 1  # rank 0 reports
    assert json.loads((two / "results.json").read_text())["provenance"]["world_size"] == 2
    assert len(list((two / "parts").glob("*.json"))) == 6  # 3 seeds + 3 null-control seeds, spread over 2 ranks
    assert_same_run(one, two)


def test_the_reach_logreg_budget_under_two_ranks_equals_one_process(tmp_path: Path) -> None:
    """Rank 0 calibrates the budget (the other waits at a barrier), both read it from parts/, then share the
    seed stacks: the same run folder as one process."""
    feats = write_by_hand(tmp_path / "f.h5", k=4, d=8, n_train=120, n_test=60)
    one, two = tmp_path / "one", tmp_path / "two"
    args = ["--methods", "ce,focal,logreg", "--seeds", "2", "--epochs", "1", "--min-steps", "1", "--batch-size",
            "32", "--lr", "1e-2", "--budget-rule", "reach-logreg", "--max-steps", "256", "-q"]
    assert mr2probe("train", "--features", str(feats), "--out", str(one), *args).returncode == 0
    r2 = mr2probe("train", "--features", str(feats), "--out", str(two), *args, ranks=2)
    assert r2.returncode == 0, r2.stderr
    cal = json.loads((two / "results.json").read_text())["budget"]["calibration"]
    assert len(cal["trials"]) >= 2 and len(list((two / "parts").glob("budget-*.json"))) == 1
    assert_same_run(one, two)


def test_bench_two_ranks_equal_one_process(tmp_path: Path) -> None:
    suite = tmp_path / "s.toml"
    suite.write_text(f"""
datasets = ["fashion-mnist"]
encoders = ["{ROOT / 'extract' / 'efficientnet-lite0.toml'}"]
methods = ["ce", "mr2"]
seeds = 2
[extract]
per_class = 4
workers = 0
batch_size = 20
[train]
epochs = 2
min_steps = 20
""")
    runs = {}
    for ranks in (1, 2):
        out, feats = tmp_path / f"out{ranks}", tmp_path / f"feats{ranks}"
        r = mr2probe("bench", str(suite), "--features-dir", str(feats), "--out", str(out), "-q", ranks=ranks)
        assert r.returncode == 0, r.stderr
        runs[ranks] = out
    cell = "fashion-mnist-efficientnet-lite0-linear"
    assert_same_run(runs[1] / cell, runs[2] / cell)
    assert (runs[2] / "summary.md").is_file()


def test_a_killed_rank_ends_the_job_and_the_command_resumes(tmp_path: Path) -> None:
    """SIGKILL one rank while it trains: torchrun stops the other, every rank says one line, no traceback;
    rerunning the same command keeps the finished seeds and completes the run."""
    feats = write_by_hand(tmp_path / "f.h5", k=4, d=8, n_train=2000, n_test=60)
    out = tmp_path / "run"
    args = ["train", "--features", str(feats), "--out", str(out), "--methods", "ce,mr2", "--seeds", "3",
            "--epochs", "1", "--min-steps", "4000", "--batch-size", "32", "-q"]
    proc = subprocess.Popen([*TORCHRUN, "-m", "mr2probe", *args], cwd=ROOT, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not list((out / "parts").glob("*.json")) and time.monotonic() < deadline:
            time.sleep(0.2)  # the first finished seed
        workers = subprocess.run(["pgrep", "-f", f"mr2probe train --features {feats}"], capture_output=True,
                                 text=True).stdout.split()
        workers = [int(p) for p in workers if int(p) != proc.pid]
        assert workers, "no rank found"
        os.kill(max(workers), signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    # no rank prints a traceback of ours (torchrun's launcher reports the failed child in its own words)
    assert f'File "{ROOT / "mr2probe"}' not in err, err[-3000:]
    assert "interrupted; rerun the same command to resume" in err, err[-3000:]
    assert not (out / "results.json").exists()
    done_before = {p.name for p in (out / "parts").glob("*.json")}
    r = mr2probe(*args, ranks=2)
    assert r.returncode == 0, r.stderr
    notes = json.loads((out / "results.json").read_text())["notes"]
    assert sum("already trained" in n for n in notes) >= len(done_before) >= 1
