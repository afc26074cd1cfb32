"""benchmarks/gpu_check.sh runs its CPU smoke version (no GPU here, or --smoke) and prints every figure."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT


@pytest.mark.slow
def test_gpu_check_smoke_runs_and_prints_its_figures() -> None:
    env = dict(os.environ, OMP_NUM_THREADS="2")
    r = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--smoke"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=560)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert "smoke version on the CPU" in out and "these figures do not describe a GPU" in out
    for key in ("extract/forward", "sweep/gemm_rate", "paper_grid_hours", "paper_grid_hours_halving",
                "halving/full wall", "halving/full steps wall", "halving/full head-steps", "K=100 mr2/ce",
                "K=1000 mr2/ce", "device_vs_cpu_max_abs_delta_acc", "B=64 step/(gemm+adamw)",
                "B=256 step/(gemm+adamw)", "paper_grid_hours_b512", "paper_grid_hours_b512_halving",
                "comparison_seconds"):
        value = float(re.search(rf"^{re.escape(key)}=([\d.]+)$", out, re.M).group(1))
        assert value > 0 or key == "device_vs_cpu_max_abs_delta_acc", key
    # halving keeps ⌈4/3⌉ then 1 of each 4-point grid, ⌈8/3⌉ then 1 of each 8-point grid: fewer head-steps
    assert float(re.search(r"^halving/full head-steps=([\d.]+)$", out, re.M).group(1)) < 0.5
    # the smoke run compares the CPU with itself: the same accuracies
    assert float(re.search(r"^device_vs_cpu_max_abs_delta_acc=([\d.]+)$", out, re.M).group(1)) == 0
    assert 0 < float(re.search(r"^sweep/gemm_rate=([\d.]+)$", out, re.M).group(1)) < 5
    assert float(re.search(r"^extract_workers/forward=([\d.]+)$", out, re.M).group(1)) > 0
    assert float(re.search(r"^device_vs_workers_cosine_min=([\d.]+)$", out, re.M).group(1)) > 0.999  # same images
    assert "peak RSS" in out and "gpu_check: done" in out


@pytest.mark.slow
def test_gpu_step_smoke_runs_and_prints_its_figures() -> None:
    """benchmarks/gpu_step.py's CPU smoke version: the step's time, the profiler's table, the logit-pass ratio."""
    env = dict(os.environ, OMP_NUM_THREADS="2")
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_step.py"), "--smoke", "--no-compile"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert "these figures do not describe a GPU" in out and "Self CPU time total" in out
    assert float(re.search(r"^\(1\) stacked step: 104 heads.* ([\d.]+) ms per step", out, re.M).group(1)) > 0
    assert float(re.search(r"^step/logit_pass=([\d.]+)$", out, re.M).group(1)) > 1  # a step is more than one pass
    assert "gpu_step: done" in out
