"""The table of bad inputs (scripts/bad_inputs.py) through the CLI's commands → exit 2 with one ``error:`` line, no
traceback, nothing written."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from conftest import ROOT

_spec = importlib.util.spec_from_file_location("bad_inputs", ROOT / "scripts" / "bad_inputs.py")
bad_inputs = importlib.util.module_from_spec(_spec)
sys.modules["bad_inputs"] = bad_inputs  # (dataclasses look their module up)
_spec.loader.exec_module(bad_inputs)
CASES = {c.name: c for c in bad_inputs.CASES}


def test_bad_input_table_is_large_and_distinct() -> None:
    assert len(CASES) == len(bad_inputs.CASES) >= 20


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_exit_2_one_line_nothing_written(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    o = bad_inputs.run_case(case, tmp_path, in_process=True)
    assert not bad_inputs.problems(case, o), f"{bad_inputs.problems(case, o)}: {o.stderr[-1500:]!r}"


SUBPROCESS_CASES = ["truncated HDF5 file", "--set mr2.c_bar=0 (c-bar must be > 0)",
                    "extract: recipe with an unknown key"]


@pytest.mark.slow
@pytest.mark.parametrize("name", SUBPROCESS_CASES)
def test_bad_input_as_a_user_runs_it(name: str, tmp_path: Path) -> None:
    """A few of the cases as real `python -m mr2probe` processes (exit status and stderr as the shell sees them)."""
    case = CASES[name]
    o = bad_inputs.run_case(case, tmp_path, in_process=False)
    assert not bad_inputs.problems(case, o), f"{bad_inputs.problems(case, o)}: {o.stderr[-1500:]!r}"
