"""Dataset registry: ``build_dataset("fashion-mnist")`` and ``DATASETS.names()``; one file per dataset family."""
from __future__ import annotations

from pathlib import Path

from .. import plugins
from ._base import DATASETS, ImageDataset, ImageSplit, require_dir


def build_dataset(name: str, root: str | Path | None = None, download: bool = False) -> ImageDataset:
    """Build a registered dataset by name (``UserError`` for unknown names or missing data)."""
    builder, arg = DATASETS.lookup(name)
    root = Path(root) if root is not None else None
    return builder(root, download, arg) if arg else builder(root, download)


plugins.import_all(__import__(__name__, fromlist=["_"]))

__all__ = ["DATASETS", "ImageDataset", "ImageSplit", "build_dataset", "require_dir"]
