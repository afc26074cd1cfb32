"""Property-based tests (hypothesis) of the ``train`` command line, one of the two places untrusted input enters
(the other, the feature-file reader: test_featurestore_fuzz.py).

Random ``train`` flag values through typer's CliRunner in this process on a tiny hand-written file end with exit 0
or 2, never an exception; on 2 exactly one ``error:`` line on stderr, and no results.json.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from conftest import write_by_hand
from mr2probe.cli import app

# FUZZ_EXAMPLES=2000 FUZZ_RANDOM=1 pytest tests/test_cli_train_fuzz.py: a longer hunt with fresh random examples
SETTINGS = dict(max_examples=int(os.environ.get("FUZZ_EXAMPLES", 40)), deadline=None, print_blob=True,
                derandomize=not os.environ.get("FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory) -> Path:
    return write_by_hand(tmp_path_factory.mktemp("fuzz") / "tiny.h5", k=3, d=4, n_train=30, n_test=12)


def _floats_text() -> st.SearchStrategy[str]:
    number = st.sampled_from(["1e-2", "0.05", "0", "-1", "1e9", "nan", "inf", "1e-300", "abc", ""]) \
        | st.floats(-1, 1).map(repr)
    return st.lists(number, min_size=1, max_size=3).map(",".join)


SET_VALUES = st.sampled_from(["1", "0", "-1", "0.5", "2", "1e30", "NaN", "Infinity", "true", "\"ema\"",
                              "\"exact\"", "abc", "[1, 2]", "{}", "null", ""])
SET_KEYS = st.sampled_from(["mr2.c_bar", "mr2.p", "mr2.lam", "mr2.tau", "mr2.exponent", "mr2.stats",
                            "mr2.ema_decay", "mr2.uniform", "focal.gamma", "ldam.s", "ldam.max_m",
                            "label_smoothing.eps", "logit_adjust.tau", "class_balanced.beta", "cdb.tau",
                            "jtt.lam_up", "jtt.stage1_epochs", "lff.q", "lff.init_seed", "group_dro.eta",
                            "fair_dro.alpha", "eql.lam_rel", "mr2.nope", "nope.x", "mr2", "mr2.c_bar"])
METHOD_NAMES = ["ce", "mr2", "focal", "ldam", "label_smoothing", "logit_adjust", "class_balanced", "cdb", "jtt",
                "lff", "group_dro", "fair_dro", "eql", "balanced_softmax", "mr2_linear", "supcon", "nope"]


@st.composite
def train_flags(draw) -> list[str]:
    flags: list[str] = []

    def maybe(flag: str, values: st.SearchStrategy) -> None:
        if draw(st.booleans()):
            flags.extend([flag, str(draw(values))])

    maybe("--epochs", st.integers(-2, 2))
    maybe("--seeds", st.integers(-1, 2))
    maybe("--lr", _floats_text())
    maybe("--wd", _floats_text())
    maybe("--batch-size", st.integers(-1, 40) | st.just(10 ** 6))
    maybe("--select", st.sampled_from(["acc", "macc", "f1", ""]))
    maybe("--val-fraction", st.sampled_from([0.1, 0.5, 0.99, 1e-9, 0.0, 1.0, 1.5, -0.2, float("nan")]))
    maybe("--head", st.sampled_from(["linear", "cosine", "nope"]))
    maybe("--adapter", st.sampled_from(["none", "none", "linear", "mlp", "nope"]))
    maybe("--methods", st.lists(st.sampled_from(METHOD_NAMES), min_size=0, max_size=3).map(",".join)
          | st.just("all"))
    for _ in range(draw(st.integers(0, 2))):
        flags.extend(["--set", f"{draw(SET_KEYS)}={draw(SET_VALUES)}"])
    if "--methods" not in flags:
        flags.extend(["--methods", "ce,mr2"])
    if "--epochs" not in flags:
        flags.extend(["--epochs", "1"])
    if "--seeds" not in flags:
        flags.extend(["--seeds", "1"])
    return flags


@settings(**SETTINGS)
@given(flags=train_flags())
def test_train_flags_exit_0_or_2_never_a_traceback(tiny_file: Path, flags: list[str]) -> None:
    out = Path(tempfile.mkdtemp(prefix="mr2fuzz-run-")) / "run"
    try:
        r = CliRunner().invoke(app, ["train", "--features", str(tiny_file), "--out", str(out), "-q",
                                     "--width", "4", *flags])
        assert r.exception is None or isinstance(r.exception, SystemExit), \
            f"{type(r.exception).__name__}: {r.exception}\n{r.output[-2000:]}"
        assert r.exit_code in (0, 2), r.output[-2000:]
        event(f"exit {r.exit_code}")
        assert "Traceback" not in r.output
        if r.exit_code == 2:
            errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
            assert len(errors) == 1 and r.stderr.rstrip().splitlines()[-1] == errors[0], r.stderr[-2000:]
            assert not (out / "results.json").exists()
        else:
            res = json.loads((out / "results.json").read_text())
            assert res["runs"] and all(math.isfinite(x["test_acc"]) for x in res["runs"])
    finally:
        shutil.rmtree(out.parent, ignore_errors=True)
