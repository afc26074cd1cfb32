"""Any image classification set laid out as class folders, split or not.

``--root DIR`` holds either

* ``train/<class>/*`` and ``test/<class>/*``, optionally ``val/<class>/*`` (subfolders inside a class folder are
  included). Classes are the sorted names of the class folders in ``train/``; every such class needs at least one
  training image, and test/val may not have a class that train lacks (they may miss some); or
* a plain tree ``<class>/*`` (torchvision ``ImageFolder``'s layout, no split folders): it is split into train / val /
  test by a seeded stratified split, :data:`DEFAULT_FRACTIONS` (0.7 / 0.1 / 0.2) with seed 0 unless the name says
  otherwise: ``imagefolder:0.8,0.1,0.1`` (train, val, test fractions; val may be 0), ``imagefolder:seed=3`` or
  ``imagefolder:0.8,0,0.2,seed=3``. Within each class the images (in ImageFolder order) are permuted with
  ``numpy.random.default_rng(seed)``; the first round(n·test) go to test, the next round(n·val) to val, the rest to
  train, so that a class of n ≥ 2 images has at least one in train and one in test (and, with n ≥ 3 and val > 0, one
  in val). Each split keeps ImageFolder order. The split is recorded in the dataset's ``source`` (a feature file's
  ``source`` attribute) and in ``extra["split"]``; ``extra["positions"]`` maps each split to the ImageFolder
  positions of its samples.

The tree is taken as split when ``train/``, ``val/`` or ``test/`` is one of its folders (so a plain tree may not have
classes by those names).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..errors import UserError
from ._base import DATASETS, DatasetOptions, DatasetSpec, ImageDataset, ImageSplit, require_dir
from ._folders import class_folders, folder_split

LAYOUT = "train/<class>/*.jpg and test/<class>/*.jpg (optional val/<class>/*.jpg), or <class>/*.jpg"
SPLIT_FOLDERS = ("train", "val", "test")
DEFAULT_FRACTIONS = (0.7, 0.1, 0.2)  # train, val, test of a plain class-folder tree
DEFAULT_SEED = 0


def load_class_folders(root: Path, name: str, split_dirs: dict[str, str], layout: str,
                       optional: tuple[str, ...] = ()) -> ImageDataset:
    """Splits ``{ours: subfolder}`` of ``root``; classes from the "train" subfolder; ``optional`` splits may be absent.

    ``layout`` describes the expected tree (relative to ``root``) for error messages.
    """
    missing = [sub for split, sub in split_dirs.items() if split not in optional and not (root / sub).is_dir()]
    if missing:
        raise UserError(f"{name}: {root} has no {'/, '.join(missing)}/ folder; expected {root}/{layout}")
    train_dir = root / split_dirs["train"]
    classes = class_folders(train_dir)
    if not classes:
        raise UserError(f"{name}: {train_dir} has no class folders (expected {train_dir}/<class>/*.jpg)")
    splits: dict[str, ImageSplit] = {}
    for split, sub in split_dirs.items():
        if (root / sub).is_dir():
            splits[split] = folder_split(root / sub, classes, name, require_all=split == "train")
    return ImageDataset(name=name, class_names=classes, splits=splits, source=str(root))


def parse_split_spec(arg: str, what: str = "imagefolder") -> tuple[tuple[float, float, float], int]:
    """``"0.8,0.1,0.1,seed=3"`` → ((0.8, 0.1, 0.1), 3); either part may be left out ("" → the defaults)."""
    fractions, seed = DEFAULT_FRACTIONS, DEFAULT_SEED
    numbers: list[float] = []
    usage = f"{what}:TRAIN,VAL,TEST[,seed=N] (e.g. {what}:0.7,0.1,0.2,seed=0)"
    for item in (p.strip() for p in arg.split(",") if p.strip()):
        key, eq, value = item.partition("=")
        try:
            if eq and key.strip() == "seed":
                seed = int(value)
            elif not eq:
                numbers.append(float(item))
            else:
                raise ValueError
        except ValueError:
            raise UserError(f"{what}: cannot read {item!r} in {what}:{arg}; expected {usage}") from None
    if numbers:
        if len(numbers) != 3:
            raise UserError(f"{what}: {what}:{arg} gives {len(numbers)} fractions, expected 3: {usage}")
        if not all(math.isfinite(f) and 0 <= f <= 1 for f in numbers) or numbers[0] <= 0 or numbers[2] <= 0:
            raise UserError(f"{what}: split fractions must lie in [0, 1] with train and test > 0, got {arg!r}")
        if abs(sum(numbers) - 1) > 1e-6:
            raise UserError(f"{what}: split fractions must add up to 1, got {'+'.join(map(str, numbers))} "
                            f"= {sum(numbers):g}")
        fractions = (numbers[0], numbers[1], numbers[2])
    if seed < 0:
        raise UserError(f"{what}: seed must be ≥ 0, got {seed}")
    return fractions, seed


def stratified_split(labels: np.ndarray, fractions: tuple[float, float, float], seed: int) -> dict[str, np.ndarray]:
    """Positions of train / val / test (each sorted), a seeded per-class split of ``labels`` (see the module doc)."""
    _, f_val, f_test = fractions
    rng = np.random.default_rng(seed)
    parts: dict[str, list[np.ndarray]] = {"train": [], "val": [], "test": []}
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        members = members[rng.permutation(len(members))]
        n = len(members)
        n_test = math.floor(n * f_test + 0.5)
        n_val = math.floor(n * f_val + 0.5)
        if n >= 2:
            n_test = max(n_test, 1)
        if n >= 3 and f_val > 0:
            n_val = max(n_val, 1)
        while n_test + n_val > n - 1 and n_val > 0:  # keep at least one training image
            n_val -= 1
        n_test = min(n_test, n - 1)
        parts["test"].append(members[:n_test])
        parts["val"].append(members[n_test:n_test + n_val])
        parts["train"].append(members[n_test + n_val:])
    return {s: np.sort(np.concatenate(p)).astype(np.int64) for s, p in parts.items()}


def load_plain_tree(root: Path, name: str, fractions: tuple[float, float, float], seed: int) -> ImageDataset:
    """A ``<class>/*`` tree split by :func:`stratified_split`; the split is described in ``source``."""
    classes = class_folders(root)
    if not classes:
        raise UserError(f"{name}: {root} has no class folders; expected {root}/{LAYOUT}")
    whole = folder_split(root, classes, name, require_all=True)
    positions = stratified_split(whole.labels, fractions, seed)
    splits: dict[str, ImageSplit] = {}
    for s, pos in positions.items():
        if len(pos):
            splits[s] = ImageSplit(labels=whole.labels[pos], load=lambda i, pos=pos: whole.load(int(pos[i])),
                                   file=lambda i, pos=pos: whole.file(int(pos[i])))
    f_train, f_val, f_test = fractions
    rule = f"seeded stratified split {f_train:g}/{f_val:g}/{f_test:g} train/val/test, seed {seed}"
    counts = ", ".join(f"{s} {len(p)}" for s, p in positions.items())
    data = ImageDataset(name=name, class_names=classes, splits=splits,
                        source=f"{root} (class folders without split folders: {rule}; {counts} images)")
    data.extra["split"] = {"fractions": {"train": f_train, "val": f_val, "test": f_test}, "seed": seed,
                           "rows": {s: len(p) for s, p in positions.items()}}
    data.extra["positions"] = {s: p for s, p in positions.items() if len(p)}
    return data


def _imagefolder(root: Path | None, arg: str | None) -> ImageDataset:
    name = "imagefolder" if arg is None else f"imagefolder:{arg}"
    if root is None:
        raise UserError(f"imagefolder needs --root DIR holding {LAYOUT}")
    root = require_dir(root, "imagefolder")  # --download does not apply: these are your own files
    if any((root / s).is_dir() for s in SPLIT_FOLDERS):
        if arg:
            present = ", ".join(f"{s}/" for s in SPLIT_FOLDERS if (root / s).is_dir())
            raise UserError(f"imagefolder: {root} already has split folders ({present}); the split settings of "
                            f"{name} apply only to a plain <class>/* tree: use --dataset imagefolder")
        return load_class_folders(root, name, {"train": "train", "val": "val", "test": "test"}, LAYOUT,
                                  optional=("val",))
    fractions, seed = parse_split_spec(arg or "")
    return load_plain_tree(root, name, fractions, seed)


@DATASETS.register("imagefolder", help="Your class folders under --root: train/<class>/*, test/<class>/*[, val/], "
                                       "or a plain <class>/* tree split 0.7/0.1/0.2 (stratified, seed 0)")
class ImageFolder(DatasetSpec):
    """Class-folder tree under --root: train/ and test/ (optional val/), or plain <class>/ folders split seeded."""

    @classmethod
    def build(cls, options: DatasetOptions) -> ImageDataset:
        return _imagefolder(options.root, None)


@DATASETS.register("imagefolder:", help="imagefolder:TRAIN,VAL,TEST[,seed=N]: a plain <class>/* tree under --root "
                                        "with your split fractions and seed (e.g. imagefolder:0.8,0,0.2,seed=1)")
class ImageFolderSplit(DatasetSpec):
    """A plain <class>/* tree under --root, split train/val/test by the fractions and seed in the name."""

    @classmethod
    def build(cls, options: DatasetOptions) -> ImageDataset:
        return _imagefolder(options.root, options.arg)
