"""CIFAR-10 and CIFAR-100 from the official "python version" pickles under ``--root``.

We read the pickles ourselves (the layout torchvision downloads to: ``cifar-10-batches-py/``, ``cifar-100-python/``)
instead of going through torchvision's classes, which md5-check every file on each load; ``--download`` still goes
through torchvision (download, checksum, extract). Labels come straight from the pickles, images stay in memory as
uint8 and are wrapped as PIL images on demand. CIFAR-100 uses its 100 fine labels.
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from ..errors import UserError
from ._base import DATASETS, DatasetOptions, DatasetSpec, ImageDataset, ImageSplit
from ._torchvision import dataset_root, fix_hint, one_line, user_errors


@dataclass(frozen=True)
class _Layout:
    name: str
    folder: str  # under --root
    train: tuple[str, ...]
    test: tuple[str, ...]
    meta: str
    names_key: str
    labels_key: str
    torchvision_class: str
    description: str  # the expected files, for error messages


CIFAR10 = _Layout("cifar10", "cifar-10-batches-py", tuple(f"data_batch_{i}" for i in range(1, 6)), ("test_batch",),
                  "batches.meta", "label_names", "labels", "CIFAR10",
                  "cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}")
CIFAR100 = _Layout("cifar100", "cifar-100-python", ("train",), ("test",), "meta", "fine_label_names", "fine_labels",
                   "CIFAR100", "cifar-100-python/{train,test,meta}")


def _unpickle(path: Path, layout: _Layout) -> dict[str, Any]:
    """One CIFAR pickle as a dict with str keys (the files are Python 2 pickles: bytes keys under Python 3)."""
    try:
        with open(path, "rb") as f:
            raw = pickle.load(f, encoding="bytes")
    except FileNotFoundError:
        raise UserError(f"{layout.name}: {path} not found (expected {path.parent.parent / layout.description}); "
                        f"{fix_hint(True)}") from None
    except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError) as e:
        raise UserError(f"{layout.name}: {path} is not a CIFAR pickle ({one_line(e)}); delete it and --download again"
                        ) from None
    if not isinstance(raw, dict):
        raise UserError(f"{layout.name}: {path} is not a CIFAR pickle (no dict inside)")
    return {k.decode("latin1") if isinstance(k, bytes) else str(k): v for k, v in raw.items()}


def _field(d: dict[str, Any], key: str, path: Path, name: str) -> Any:
    if key not in d:
        raise UserError(f"{name}: {path} has no {key!r} entry; is it the right CIFAR version?")
    return d[key]


def _split(folder: Path, files: tuple[str, ...], layout: _Layout, n_classes: int) -> ImageSplit:
    data, labels = [], []
    for fname in files:
        d = _unpickle(folder / fname, layout)
        data.append(np.asarray(_field(d, "data", folder / fname, layout.name), dtype=np.uint8))
        labels.append(np.asarray(_field(d, layout.labels_key, folder / fname, layout.name), dtype=np.int64))
    x, y = np.concatenate(data), np.concatenate(labels)
    if x.ndim != 2 or x.shape[1] != 3 * 32 * 32 or len(x) != len(y):
        raise UserError(f"{layout.name}: {folder} holds data {x.shape} and {len(y)} labels; expected N x 3072 and N")
    if len(y) and (y.min() < 0 or y.max() >= n_classes):
        raise UserError(f"{layout.name}: labels in {folder} fall outside 0..{n_classes - 1}")
    images = x.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # NCHW rows -> NHWC view
    return ImageSplit(labels=y, load=lambda i: Image.fromarray(np.ascontiguousarray(images[i])))


def _download(layout: _Layout, root: Path) -> None:
    """Let torchvision download, checksum and extract the archive into ``root`` (a no-op when it is complete)."""
    import torchvision.datasets as tvd

    with user_errors(layout.name, root, layout.description, download=True):
        getattr(tvd, layout.torchvision_class)(str(root), train=True, download=True)


def load_cifar(layout: _Layout, root: Path | None, download: bool) -> ImageDataset:
    """Build a CIFAR dataset from ``root/<layout.folder>``, downloading first if asked."""
    root = dataset_root(root, download, layout.name, layout.description)
    if download:
        _download(layout, root)
    folder = root / layout.folder
    if not folder.is_dir():
        raise UserError(f"{layout.name}: no {layout.folder}/ under {root} (expected {root / layout.description}); "
                        f"{fix_hint(True)}")
    meta = _unpickle(folder / layout.meta, layout)
    names = [n.decode("utf-8") if isinstance(n, bytes) else str(n)
             for n in _field(meta, layout.names_key, folder / layout.meta, layout.name)]
    splits = {"train": _split(folder, layout.train, layout, len(names)),
              "test": _split(folder, layout.test, layout, len(names))}
    return ImageDataset(name=layout.name, class_names=names, splits=splits, source=str(folder))


@DATASETS.register("cifar10", help="CIFAR-10, 10 classes, 50k/10k 32x32 (--root with cifar-10-batches-py/)")
class Cifar10(DatasetSpec):
    """CIFAR-10: official train (5 batches) / test split."""

    downloadable = True

    @classmethod
    def build(cls, options: DatasetOptions) -> ImageDataset:
        return load_cifar(CIFAR10, options.root, options.download)


@DATASETS.register("cifar100", help="CIFAR-100, 100 fine classes, 50k/10k 32x32 (--root with cifar-100-python/)")
class Cifar100(DatasetSpec):
    """CIFAR-100 (fine labels): official train / test split."""

    downloadable = True

    @classmethod
    def build(cls, options: DatasetOptions) -> ImageDataset:
        return load_cifar(CIFAR100, options.root, options.download)
