"""ImageNet-1k (ILSVRC-2012) as class folders: ``--root`` holds ``train/<wnid>/*.JPEG`` and ``val/<wnid>/*.JPEG``.

Class order is the sorted WordNet ids (n01440764, ...), as in torchvision's ImageFolder and timm. The official val set
is the test split of linear probing (there is no separate val split; the trainer holds one out of train). Class names
are the human-readable synset descriptions ("tench, Tinca tinca") from timm's offline ``ImageNetInfo`` when timm is
installed (the one description shared by two synsets, "crane" the bird and the machine, gets its wnid appended), else
the wnids themselves. Subsets of the 1000 classes (ImageNet-100 and the like) work too.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from ..errors import UserError
from ._base import DATASETS, DatasetOptions, DatasetSpec, ImageDataset, require_dir
from ._folders import IMAGE_EXTENSIONS, class_folders
from .folder import load_class_folders

LAYOUT = "train/<wnid>/*.JPEG and val/<wnid>/*.JPEG (e.g. train/n01440764/n01440764_10026.JPEG)"


def wnid_descriptions(wnids: list[str]) -> list[str]:
    """Readable names for ImageNet synset ids (timm's bundled ImageNetInfo; offline); unknown ids stay as they are."""
    try:
        from timm.data import ImageNetInfo
    except ImportError:
        return list(wnids)
    info = ImageNetInfo()
    known = set(info.label_names())
    names = [info.label_name_to_description(w) if w in known else w for w in wnids]
    repeated = {n for n, c in Counter(names).items() if c > 1}
    return [f"{n} ({w})" if n in repeated else n for n, w in zip(names, wnids, strict=True)]


@DATASETS.register("imagenet", help="ImageNet-1k class folders: --root DIR with train/<wnid>/, val/<wnid>/ (val=test)")
class ImageNet(DatasetSpec):
    """ILSVRC-2012 train/ and val/ class folders under --root; val/ is the test split."""

    @classmethod
    def build(cls, options: DatasetOptions) -> ImageDataset:
        return load_imagenet(options.root)


def load_imagenet(root: Path | None) -> ImageDataset:
    """ImageNet's class folders under ``root`` (UserError where missing or val/ is unsorted)."""
    if root is None:
        raise UserError(f"imagenet needs --root DIR holding {LAYOUT} (it cannot be downloaded automatically)")
    root = require_dir(root, "imagenet")
    val = root / "val"
    if val.is_dir() and not class_folders(val) and any(
            p.suffix.lower() in IMAGE_EXTENSIONS for p in val.iterdir()):
        raise UserError(f"imagenet: {val} holds the images directly; sort them into val/<wnid>/ class folders "
                        "(as the ILSVRC-2012 val ground truth gives them) first")
    data = load_class_folders(root, "imagenet", {"train": "train", "test": "val"}, LAYOUT)
    data.extra["wnids"] = data.class_names
    data.class_names = wnid_descriptions(data.class_names)
    return data
