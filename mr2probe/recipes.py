"""Extraction recipes: one small TOML file per encoder (``extract/*.toml``), not code; and the run configuration
file of ``mr2probe train --config`` (a suite's ``[train]`` table on its own, :func:`load_train_config`).

Recipe keys: ``encoder`` (required), every extraction setting (:data:`~mr2probe.settings.EXTRACT`: ``batch_size``,
``workers``, ``dtype``, ``amp``, ``runtime``, ``per_class``, ``device``, ``preprocess``, ``pool``, ``blocks``),
and ``description`` (free text, ignored). Unknown keys are refused so a typo never goes unnoticed.
"""
from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from .errors import UserError
from .settings import EXTRACT, check_table

SETTINGS = ("encoder", *EXTRACT)  # what a recipe sets: the encoder and the extraction settings
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
    if not isinstance(data["encoder"], str):
        raise UserError(f"recipe {path}: encoder must be a str, got {data['encoder']!r}")
    settings = {k: v for k, v in data.items() if k in EXTRACT}
    return {"encoder": data["encoder"], **check_table(settings, f"recipe {path}", table=EXTRACT)}


def load_train_config(path: str | Path) -> dict[str, Any]:
    """A run's configuration file for ``mr2probe train --config``: a ``[train]`` table with the keys of a suite's
    ``[train]`` (every setting of :data:`~mr2probe.settings.TRAIN` by its name, plus ``set = {method = {param =
    value}}``), checked like one; returns the values converted (grids as tuples)."""
    path = Path(path)
    data = read_toml(path, "config file", "`mr2probe train --print-config`")
    other = sorted(set(data) - {"train"})
    if other or not isinstance(data.get("train", {}), dict):
        raise UserError(f"config file {path}: only a [train] table is read (as in a suite), found "
                        f"{', '.join(other) or 'train = ' + repr(data['train'])}; `mr2probe train --print-config` "
                        "prints one")
    train = check_table(data.get("train", {}), f"config file {path} [train]", extra={"set": dict})
    if not all(isinstance(v, dict) for v in train.get("set", {}).values()):
        raise UserError(f"config file {path} [train]: set takes {{method = {{param = value}}}}")
    return train


def _toml_value(value: Any) -> str:
    """A TOML literal of a setting value: strings, numbers, booleans, lists (grids) and inline tables."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return json.dumps(value)


def train_config_toml(values: dict[str, Any]) -> str:
    """``values`` (every training setting, plus ``set``) as the ``[train]`` table that :func:`load_train_config`
    reads back; a setting whose value is None (``device``: chosen at run time) is written as a comment."""
    lines = ["[train]"]
    for name, value in values.items():
        if name == "set" and not value:
            continue
        lines.append(f"# {name} = (chosen at run time)" if value is None else f"{name} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"
