"""Dataset registry: ``build_dataset("fashion-mnist")`` and ``DATASETS.names()``; one file per dataset family.

Third-party datasets join through the entry-point group ``mr2probe.datasets`` (see :mod:`mr2probe.registry`)."""
from __future__ import annotations

from pathlib import Path

from .. import plugins
from ._base import DATASETS, DatasetOptions, DatasetSpec, ImageDataset, ImageSplit, require_dir


def build_dataset(name: str, root: str | Path | None = None, download: bool = False) -> ImageDataset:
    """Build a registered dataset by name (``UserError`` for unknown names or missing data)."""
    return DATASETS.create(name, root=Path(root) if root is not None else None, download=download)


plugins.import_all(__import__(__name__, fromlist=["_"]))

__all__ = ["DATASETS", "DatasetOptions", "DatasetSpec", "ImageDataset", "ImageSplit", "build_dataset", "require_dir"]
