"""Extraction recipes: one small TOML file per encoder (``extract/*.toml``), not code.

Keys: ``encoder`` (required), ``batch_size``, ``workers``, ``dtype``, ``amp``, ``runtime``, ``per_class``,
``device``, and ``description`` (free text, ignored). Unknown keys are refused so a typo never goes unnoticed.
"""
from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from .errors import UserError

SETTINGS = {"encoder": str, "batch_size": int, "workers": int, "dtype": str, "amp": str, "runtime": str,
            "per_class": int, "device": str}
INFO_KEYS = {"description"}


def read_toml(path: str | Path, what: str, shipped: str) -> dict[str, Any]:
    """A TOML file as a dict, or a one-line UserError (``what`` names the file kind, ``shipped`` where the
    project's own ones are)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} {path} not found (see {shipped} for the shipped {what}s)")
    try:
        return tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{what} {path} is not valid TOML: {e}") from None


def load_recipe(path: str | Path) -> dict[str, Any]:
    """Parse and check a recipe; returns the extraction settings it sets."""
    path = Path(path)
    data = read_toml(path, "recipe", "extract/")
    unknown = sorted(set(data) - set(SETTINGS) - INFO_KEYS)
    if unknown:
        raise UserError(f"recipe {path}: unknown key(s) {', '.join(unknown)}; allowed: "
                        f"{', '.join(sorted(set(SETTINGS) | INFO_KEYS))}")
    if "encoder" not in data:
        raise UserError(f"recipe {path} has no 'encoder' key")
    for key, typ in SETTINGS.items():
        if key in data and not isinstance(data[key], typ):
            raise UserError(f"recipe {path}: {key} must be a {typ.__name__}, got {data[key]!r}")
    return {k: v for k, v in data.items() if k in SETTINGS}
