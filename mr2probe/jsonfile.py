"""The JSON files a run writes (results.json, summary.json, parts): compact, yet readable line by line.

:func:`json_text` opens the outer ``open_levels`` levels of objects and of arrays of them one item per line (a
results.json has one line per field of a run) and writes everything deeper, and any array of plain values, on one
line without spaces; ``digits`` rounds floats to that many significant digits (derived statistics, not the raw
per-class accuracies). A run's grid of hyperparameter points is stored as columns (:func:`grid_columns`: each
key once, not once per point); :func:`grid_rows` reads either layout back as one dict per point.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .atomic import atomic_text

OPEN_LEVELS = 3  # results.json: the file, its "runs" list, each run's fields


def _rounded(obj: Any, digits: int) -> Any:
    if isinstance(obj, float) and math.isfinite(obj):
        return float(f"{obj:.{digits}g}")
    if isinstance(obj, dict):
        return {k: _rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_rounded(v, digits) for v in obj]
    return obj


def _text(obj: Any, level: int, open_levels: int) -> str:
    flat = isinstance(obj, (list, tuple)) and not any(isinstance(v, (dict, list, tuple)) for v in obj)
    if level >= open_levels or not isinstance(obj, (dict, list, tuple)) or not obj or flat:
        return json.dumps(obj, separators=(",", ":"), default=str)
    pad, end = " " * (level + 1), " " * level
    if isinstance(obj, dict):
        items = [f"{pad}{json.dumps(str(k))}: {_text(v, level + 1, open_levels)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + end + "}"
    return "[\n" + ",\n".join(pad + _text(v, level + 1, open_levels) for v in obj) + "\n" + end + "]"


def json_text(obj: Any, open_levels: int = OPEN_LEVELS, digits: int | None = None) -> str:
    """``obj`` as JSON: the outer ``open_levels`` levels one item per line, deeper values compact; floats rounded
    to ``digits`` significant digits when given. ``json.loads`` of it equals ``obj`` (rounded)."""
    return _text(_rounded(obj, digits) if digits else obj, 0, open_levels) + "\n"


def atomic_json(path: Path, obj: Any, digits: int | None = None) -> None:
    """Write :func:`json_text` of ``obj`` through a temporary name."""
    atomic_text(path, json_text(obj, digits=digits))


def grid_columns(rows: list[dict[str, Any]]) -> dict[str, Any] | list[dict[str, Any]]:
    """A grid as columns, ``{"hparams": {name: [v, …]}, "val_score": [s, …], …}``; rows whose keys differ are
    kept as rows (a column layout would need a fill value)."""
    if not rows or any(r.keys() != rows[0].keys() or r["hparams"].keys() != rows[0]["hparams"].keys()
                       for r in rows):
        return rows
    cols: dict[str, Any] = {"hparams": {k: [r["hparams"][k] for r in rows] for k in rows[0]["hparams"]}}
    cols.update({k: [r[k] for r in rows] for k in rows[0] if k != "hparams"})
    return cols


def grid_rows(grid: dict[str, Any] | list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """One ``{"hparams": {...}, "val_score": …, …}`` per grid point, from either layout (or none: ``[]``)."""
    if not grid:
        return []
    if isinstance(grid, list):
        return grid
    names, other = list(grid["hparams"]), [k for k in grid if k != "hparams"]
    n = len(grid[other[0]]) if other else len(next(iter(grid["hparams"].values())))
    return [{"hparams": {k: grid["hparams"][k][i] for k in names}, **{k: grid[k][i] for k in other}}
            for i in range(n)]
