"""No function or method of the package is longer than MAX_LINES lines."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mr2probe"
MAX_LINES = 80


def long_functions() -> list[tuple[str, str, int]]:
    """(module, function, lines) of every function or method over :data:`MAX_LINES` lines."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES:
                    out.append((path.relative_to(PACKAGE).as_posix(), node.name, lines))
    return out


def test_no_function_is_over_80_lines() -> None:
    assert long_functions() == []
