#!/usr/bin/env python
"""Bad input → exit 2, one line on stderr naming the problem and the fix, no traceback, nothing written.

Runs every case of ``CASES`` through the real CLI and prints a markdown table "case | exit code | message"::

    .venv/bin/python scripts/bad_inputs.py               # each case as `python -m mr2probe ...` (subprocess)
    .venv/bin/python scripts/bad_inputs.py --in-process  # through typer's CliRunner (faster)

tests/test_cli_errors.py imports this table, so the tests and the report never drift. A case builds its inputs
in a fresh folder and returns the CLI arguments; every output path it names lies inside that folder, whose
file listing must be the same before and after the run ("no partial output").
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from conftest import write_by_hand  # noqa: E402  (hand-written files per features.md, not the project's writer)


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[Path], list[str]]  # builds inputs under the folder, returns the CLI arguments
    needle: str  # must appear in the error line (the problem named)


@dataclass
class Outcome:
    code: int
    stderr: str
    traceback: bool  # a traceback was printed, or (in process) an exception other than SystemExit escaped
    created: list[str]  # files or folders that exist only after the run
    changed: list[str]  # files whose size or mtime the run changed

    @property
    def lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]

    @property
    def message(self) -> str:
        return self.lines[-1] if self.lines else ""


# ---- building blocks ---------------------------------------------------------------------------------------

def ok_file(d: Path, **kw) -> Path:
    return write_by_hand(d / "ok.h5", **kw)


def mutated(d: Path, fn: Callable[[h5py.File], None], **kw) -> Path:
    """A valid hand-written file (K=4, D=8, 80 train / 40 test rows), then ``fn`` applied to it."""
    path = write_by_hand(d / "bad.h5", **kw)
    with h5py.File(path, "a") as f:
        fn(f)
    return path


def replace(split: str, key: str, value: Callable[[np.ndarray], np.ndarray]) -> Callable[[h5py.File], None]:
    def fn(f: h5py.File) -> None:
        old = f[split][key][()]
        del f[split][key]
        f[split].create_dataset(key, data=value(old))
    return fn


def set_attr(key: str, value) -> Callable[[h5py.File], None]:
    return lambda f: f.attrs.__setitem__(key, value)


def train(features: Path, *extra: str, out: Path | None = None) -> list[str]:
    out = out if out is not None else features.parent / "run"
    return ["train", "--features", str(features), "--out", str(out), "--epochs", "1", "--seeds", "1",
            "--batch-size", "16", "-q", *extra]


def train_ok(*extra: str) -> Callable[[Path], list[str]]:
    return lambda d: train(ok_file(d), *extra)


def train_bad(fn: Callable[[h5py.File], None], **kw) -> Callable[[Path], list[str]]:
    return lambda d: train(mutated(d, fn, **kw))


def raw_file(content: bytes) -> Callable[[Path], list[str]]:
    def make(d: Path) -> list[str]:
        (d / "f.h5").write_bytes(content)
        return train(d / "f.h5")
    return make


def empty(d: Path) -> Path:
    (d / "f.h5").write_bytes(b"")
    return d / "f.h5"


def truncated(d: Path) -> list[str]:
    path = ok_file(d)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return train(path)


def names(n: int) -> Callable[[h5py.File], None]:
    """class_names of ``n`` classes for a file whose labels use 5."""
    return set_attr("class_names", json.dumps([f"c{i}" for i in range(n)]))


def drop_class_from(split: str, k: int = 3) -> Callable[[h5py.File], None]:
    return replace(split, "labels", lambda y: np.where(y == k, 0, y))


def out_under_file(d: Path) -> list[str]:
    (d / "a_file").write_text("not a folder\n")
    return train(ok_file(d), out=d / "a_file" / "run")


def recipe(text: str) -> Callable[[Path], list[str]]:
    def make(d: Path) -> list[str]:
        (d / "bad.toml").write_text(text)
        return ["extract", "--recipe", str(d / "bad.toml"), "--dataset", "fashion-mnist", "--out", str(d / "e.h5")]
    return make


def missing_with_partial(d: Path) -> list[str]:
    (d / "f.h5.partial").write_bytes(b"")
    return train(d / "f.h5")


CASES: list[Case] = [
    # feature files
    Case("missing feature file", lambda d: train(d / "nope.h5"), "not found"),
    Case("missing file, unfinished .partial beside it", missing_with_partial, "resume"),
    Case("feature path is a folder", lambda d: train(d), "is a folder"),
    Case("empty (0-byte) file", lambda d: train(empty(d)), "empty"),
    Case("not HDF5 (text file)", raw_file(b"hello, not hdf5\n" * 20), "not an HDF5"),
    Case("truncated HDF5 file", truncated, "extract it again"),
    Case("wrong format attribute", train_bad(set_attr("format", "other.format")), "format"),
    Case("newer format_version", train_bad(set_attr("format_version", 2)), "newer"),
    Case("format_version not an integer", train_bad(set_attr("format_version", "1")), "format_version"),
    Case("class_names not JSON", train_bad(set_attr("class_names", "a, b, c")), "class_names"),
    Case("class_names empty list", train_bad(set_attr("class_names", "[]")), "class_names"),
    Case("missing split (no test group)", train_bad(lambda f: f.__delitem__("test")), "'test' is missing"),
    Case("incomplete split", train_bad(lambda f: f["train"].attrs.__setitem__("complete", False)), "incomplete"),
    Case("NaN features", train_bad(replace("train", "features", lambda x: np.where(x > 2, np.nan, x))), "NaN"),
    Case("Inf features", train_bad(replace("test", "features", lambda x: np.where(x > 2, np.inf, x))), "Inf"),
    Case("negative labels", train_bad(replace("train", "labels", lambda y: y - 1)), "outside [0, 4)"),
    Case("float labels", train_bad(replace("train", "labels", lambda y: y.astype(np.float32))), "integers"),
    Case("dim differs between splits", train_bad(replace("test", "features", lambda x: x[:, :3])), "dimension"),
    Case("labels use 5 classes, class_names lists 4", train_bad(names(4), k=5), "outside [0, 4)"),
    Case("labels use 5 classes, class_names lists 6", train_bad(names(6), k=5), "no training samples"),
    Case("class absent from train", train_bad(drop_class_from("train")), "no training samples"),
    Case("class absent from test", train_bad(drop_class_from("test")), "no test samples"),
    # train flags
    Case("--head unknown", train_ok("--head", "nope"), "unknown head"),
    Case("--adapter unknown", train_ok("--adapter", "nope"), "unknown adapter"),
    Case("--methods unknown", train_ok("--methods", "ce,nope"), "unknown method"),
    Case("--methods empty", train_ok("--methods", ","), "--methods"),
    Case("method needs an adapter (supcon, --adapter none)", train_ok("--methods", "supcon"), "adapter"),
    Case("--select unknown", train_ok("--select", "f1"), "--select"),
    Case("--val-fraction 1.5", train_ok("--val-fraction", "1.5"), "--val-fraction"),
    Case("--epochs 0", train_ok("--epochs", "0"), "--epochs"),
    Case("--seeds 0", train_ok("--seeds", "0"), "--seeds"),
    Case("--batch-size 1", train_ok("--batch-size", "1"), "--batch-size"),
    Case("--lr not a number", train_ok("--lr", "fast"), "--lr"),
    Case("--lr negative", train_ok("--lr", "-0.1"), "--lr"),
    Case("--wd negative", train_ok("--wd", "-1"), "--wd"),
    Case("--wd nan", train_ok("--wd", "nan"), "--wd"),
    Case("--max-memory not a size", train_ok("--max-memory", "lots"), "--max-memory"),
    Case("--set without METHOD.PARAM=", train_ok("--set", "c_bar=1"), "--set"),
    Case("--set unknown key", train_ok("--set", "mr2.nope=1"), "no hyperparameter"),
    Case("--set for a method not in --methods", train_ok("--methods", "ce,mr2", "--set", "focal.gamma=1"),
         "not in --methods"),
    Case("--set with the wrong type (jtt.stage1_epochs=1e30)",
         train_ok("--methods", "ce,jtt", "--set", "jtt.stage1_epochs=1e30"), "must be an integer"),
    Case("--set a non-finite number (focal.gamma=NaN)", train_ok("--methods", "focal", "--set", "focal.gamma=NaN"),
         "finite"),
    Case("--set mr2.c_bar=0 (c-bar must be > 0)", train_ok("--set", "mr2.c_bar=0"), "c_bar"),
    Case("--set mr2.p=0.5 (p must be >= 1)", train_ok("--set", "mr2.p=0.5"), "p must"),
    Case("--out inside a regular file", out_under_file, "cannot write to output folder"),
    # other commands
    Case("extract: recipe with an unknown key", recipe('encoder = "efficientnet-lite0"\nbatchsize = 32\n'),
         "unknown key"),
    Case("extract: recipe not valid TOML", recipe('encoder = "efficientnet-lite0\n'), "not valid TOML"),
    Case("extract: recipe file missing", lambda d: ["extract", "--recipe", str(d / "none.toml"), "--dataset",
                                                    "fashion-mnist", "--out", str(d / "e.h5")], "not found"),
    Case("extract: unknown encoder", lambda d: ["extract", "--encoder", "nope", "--dataset", "fashion-mnist",
                                                "--out", str(d / "e.h5")], "unknown encoder"),
    Case("extract: unknown dataset", lambda d: ["extract", "--encoder", "efficientnet-lite0", "--dataset", "nope",
                                                "--out", str(d / "e.h5")], "unknown dataset"),
    Case("extract: missing dataset root", lambda d: ["extract", "--encoder", "efficientnet-lite0", "--dataset",
                                                     "cifar100", "--root", str(d / "no-such-dir"), "--out",
                                                     str(d / "e.h5")], "cifar"),
    Case("info: empty file", lambda d: ["info", str(empty(d))], "empty"),
    Case("report: folder without results.json", lambda d: ["report", str(d)], "not found"),
]


# ---- running ------------------------------------------------------------------------------------------------

def _snapshot(d: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(d)): (p.stat().st_size if p.is_file() else -1, p.stat().st_mtime_ns)
            for p in d.rglob("*")}


def run_case(case: Case, d: Path, in_process: bool = False) -> Outcome:
    """Build the case's inputs in the (empty) folder ``d``, run the CLI on them, report what happened."""
    args = case.make(d)
    before = _snapshot(d)
    if in_process:
        from typer.testing import CliRunner

        from mr2probe.cli import app

        r = CliRunner().invoke(app, args)
        code, stderr = r.exit_code, r.stderr
        tb = (r.exception is not None and not isinstance(r.exception, SystemExit)) or "Traceback" in r.output
    else:
        env = dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="200")
        p = subprocess.run([sys.executable, "-m", "mr2probe", *args], capture_output=True, text=True, cwd=ROOT,
                           env=env, timeout=600)
        code, stderr = p.returncode, p.stderr
        tb = "Traceback" in p.stderr or "Traceback" in p.stdout
    after = _snapshot(d)
    created = sorted(set(after) - set(before))
    changed = sorted(k for k in before if k in after and after[k] != before[k])
    return Outcome(code, stderr, tb, created, changed)


def problems(case: Case, o: Outcome) -> list[str]:
    """What is wrong with the outcome of a bad-input case (empty: exit 2, one line naming it, nothing written)."""
    bad = []
    if o.code != 2:
        bad.append(f"exit code {o.code}, expected 2")
    if o.traceback:
        bad.append("traceback")
    if len(o.lines) != 1:
        bad.append(f"{len(o.lines)} lines on stderr, expected 1")
    if not o.message.startswith("error: ") or case.needle not in o.message:
        bad.append(f"message does not say {case.needle!r}")
    if o.created or o.changed:
        bad.append(f"wrote {', '.join(o.created + o.changed)}")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--in-process", action="store_true", help="Use typer's CliRunner instead of subprocesses.")
    ap.add_argument("--jobs", type=int, default=2, help="Cases run at once (subprocess mode) [2].")
    ap.add_argument("-k", default="", help="Only cases whose name contains this.")
    opts = ap.parse_args()
    cases = [c for c in CASES if opts.k in c.name]
    with tempfile.TemporaryDirectory(prefix="mr2probe-bad-") as tmp:
        dirs = [Path(tmp) / f"case{i:02d}" for i in range(len(cases))]
        for d in dirs:
            d.mkdir()
        jobs = 1 if opts.in_process else max(1, opts.jobs)
        with ThreadPoolExecutor(jobs) as pool:
            outcomes = list(pool.map(lambda cd: run_case(cd[0], cd[1], opts.in_process), zip(cases, dirs)))
        print("| case | exit code | message |")
        print("|---|---|---|")
        failed = 0
        for case, d, o in zip(cases, dirs, outcomes):
            bad = problems(case, o)
            failed += bool(bad)
            msg = " / ".join(o.lines).replace(tmp, "$TMP").replace("|", "\\|")
            print(f"| {case.name} | {o.code} | {msg}{' **(' + '; '.join(bad) + ')**' if bad else ''} |")
    print(f"\n{len(cases) - failed}/{len(cases)} cases: exit 2, one line, no traceback, nothing written",
          file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
