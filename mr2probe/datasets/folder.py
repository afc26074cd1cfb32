"""Any image classification set laid out as class folders.

``--root DIR`` holds ``train/<class>/*`` and ``test/<class>/*``, optionally ``val/<class>/*`` (subfolders inside a
class folder are included). Classes are the sorted names of the class folders in ``train/``; every such class needs
at least one training image, and test/val may not have a class that train lacks (they may miss some).
"""
from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from ._base import DATASETS, ImageDataset, ImageSplit, require_dir
from ._folders import class_folders, folder_split

LAYOUT = "train/<class>/*.jpg and test/<class>/*.jpg (optional val/<class>/*.jpg)"


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


@DATASETS.register("imagefolder", help="Your class folders: --root DIR with train/<class>/*, test/<class>/*[, val/]")
def imagefolder(root: Path | None, download: bool = False) -> ImageDataset:
    """Class-folder tree under --root: train/ and test/ (and optional val/) each holding one folder per class."""
    if root is None:
        raise UserError(f"imagefolder needs --root DIR holding {LAYOUT}")
    root = require_dir(root, "imagefolder")  # --download does not apply: these are your own files
    return load_class_folders(root, "imagefolder", {"train": "train", "val": "val", "test": "test"}, LAYOUT,
                              optional=("val",))
