"""Shared fixtures: small feature files written by hand with h5py, following features.md (not the project)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = ROOT / "mr2probe" / "data" / "fmnist-effl0-small.h5"


def write_by_hand(path: Path, k: int = 4, d: int = 8, n_train: int = 80, n_test: int = 40, seed: int = 0,
                  val: bool = False, dtype: str = "float32", **overrides) -> Path:
    """A feature file with separable Gaussian classes, written with plain h5py per features.md."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 3, size=(k, d))
    with h5py.File(path, "w") as f:
        f.attrs["format"] = "mr2probe.features"
        f.attrs["format_version"] = 1
        f.attrs["encoder"] = "hand"
        f.attrs["dataset"] = "gauss"
        f.attrs["class_names"] = json.dumps([f"c{i}" for i in range(k)])
        f.attrs["created_utc"] = "2026-01-01T00:00:00+00:00"
        f.attrs["mr2probe_version"] = "0"
        f.attrs["torch_version"] = "0"
        f.attrs["preprocessing"] = "{}"
        for key, v in overrides.items():
            f.attrs[key] = v
        for split, n in (("train", n_train), ("test", n_test)) + ((("val", n_test),) if val else ()):
            y = np.arange(n) % k
            x = centers[y] + rng.normal(0, 1.0 + y[:, None] * 0.5, size=(n, d))  # class k varies more
            g = f.create_group(split)
            g.create_dataset("features", data=x.astype(dtype))
            g.create_dataset("labels", data=y.astype(np.int64))
            g.create_dataset("index", data=np.arange(n, dtype=np.int64))
            g.attrs["complete"] = True
    return path


@pytest.fixture
def hand_file(tmp_path: Path) -> Path:
    return write_by_hand(tmp_path / "hand.h5")


def run_cli(*args: str, timeout: float = 600):
    """Run ``python -m mr2probe ARGS`` in a subprocess; returns CompletedProcess (text)."""
    import subprocess

    return subprocess.run([sys.executable, "-m", "mr2probe", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def md_rows(text: str, first: str) -> list[dict[str, str]]:
    """The rows of the markdown pipe table in ``text`` whose header starts with column ``first``, as
    {column: stripped cell} (the alignment row skipped)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|")
                 and line.strip("|").split("|")[0].strip() == first)
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, (c.strip() for c in line.strip().strip("|").split("|")))))
    return rows
