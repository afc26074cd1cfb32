"""Import every module of a registry package so that each file registers its entries (one file = one entry)."""
from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


def import_all(package: ModuleType) -> None:
    """Import each submodule of ``package`` (skipping private ones such as ``_base``)."""
    for info in pkgutil.iter_modules(package.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package.__name__}.{info.name}")
