"""A feature file larger than the memory cap trains through the streaming path without ever holding it: an
ImageNet-shaped file (D = 768, float16) at reduced N (600k rows: 0.9 GB on disk, 1.8 GB as float32), trained
with --max-memory 128MB, keeps the training process's peak RSS below the file's float32 size — the same run held
in memory needs more than that (both measured in the same test)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow  # make test-all; make test leaves these out

N_TRAIN, N_TEST, D, K = 600_000, 5_000, 768, 100


def write_imagenet_shaped(path: Path) -> Path:
    rng = np.random.default_rng(0)
    centers = rng.normal(0, 1, size=(K, D)).astype(np.float32)
    with h5py.File(path, "w") as f:
        f.attrs.update({"format": "mr2probe.features", "format_version": 1, "encoder": "synthetic",
                        "dataset": "imagenet-shaped", "class_names": json.dumps([f"c{i}" for i in range(K)])})
        for split, n in (("train", N_TRAIN), ("test", N_TEST)):
            g = f.create_group(split)
            x = g.create_dataset("features", shape=(n, D), dtype=np.float16, chunks=(4096, D))
            y = np.arange(n) % K
            for i in range(0, n, 50_000):  # written in pieces: the test itself stays small
                yy = y[i:i + 50_000]
                x[i:i + len(yy)] = (centers[yy] + 2 * rng.normal(0, 1, size=(len(yy), D))).astype(np.float16)
            g.create_dataset("labels", data=y.astype(np.int64))
            g.create_dataset("index", data=np.arange(n, dtype=np.int64))
            g.attrs["complete"] = True
    return path


MEASURE = """
import resource, subprocess, sys
r = subprocess.run([sys.executable, "-m", "mr2probe", *sys.argv[1:]])
print(f"peak_rss_kib={resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}")
sys.exit(r.returncode)
"""


def peak_rss_bytes(args: list[str]) -> tuple[int, subprocess.CompletedProcess]:
    """Run ``mr2probe ARGS`` under a fresh wrapper whose only child it is; return that child's peak resident set
    size (bytes, from getrusage) and the completed process."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", MEASURE, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=900)
    kib = int(r.stdout.rsplit("peak_rss_kib=", 1)[1].split()[0])
    return kib * 1024, r


def test_streamed_training_stays_below_the_file_size(tmp_path: Path) -> None:
    feats = write_imagenet_shaped(tmp_path / "big.h5")
    float32_bytes = (N_TRAIN + N_TEST) * D * 4
    common = ["train", "--features", str(feats), "--methods", "ce", "--seeds", "1", "--no-null", "--epochs", "1",
              "--min-steps", "0", "--lr", "0.01", "--wd", "0.0001", "-q"]
    streamed_peak, r = peak_rss_bytes([*common, "--out", str(tmp_path / "s"), "--max-memory", "128MB"])
    assert r.returncode == 0, r.stderr
    notes = json.loads((tmp_path / "s" / "results.json").read_text())
    assert notes["provenance"]["features_in_memory"] is False
    assert streamed_peak < float32_bytes, (streamed_peak / 2**30, float32_bytes / 2**30)
    memory_peak, r = peak_rss_bytes([*common, "--out", str(tmp_path / "m"), "--max-memory", "8GiB"])
    assert r.returncode == 0, r.stderr
    print(f"peak RSS: streamed {streamed_peak / 2**30:.2f} GiB, in memory {memory_peak / 2**30:.2f} GiB, the file as "
          f"float32 {float32_bytes / 2**30:.2f} GiB")
    assert memory_peak > float32_bytes > streamed_peak  # the cap is what kept the streamed run small
