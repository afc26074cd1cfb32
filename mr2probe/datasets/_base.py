"""The dataset registry and the two small types every dataset entry returns.

An entry is a :class:`DatasetSpec` subclass registered with ``@DATASETS.register("name")`` (or ``"family:"``), built
through one signature, ``DATASETS.create(name, root=..., download=...)`` = ``spec.build(DatasetOptions(arg=<text
after the colon>, root=..., download=...))``; third-party ones join through the entry-point group
``mr2probe.datasets``. Labels are available without decoding images (``split.labels``), images are
decoded one at a time (``split.image(i)`` → RGB PIL image) so extraction can shard, resume and stream. A split
whose images are files also names them (``split.file(i)``; ``split.read(i)`` gives the bytes of one stored inside
another file, such as a tar shard): extraction then reads their bytes (``split.raw(i)``)
and decodes them where it resizes (``split.pixels(i)`` on the CPU, or JPEGs batched on a CUDA device).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ClassVar

import numpy as np
import torch
from PIL import Image

from ..errors import UserError
from ..registry import Options, Registry, Spec
from ._decode import decode_rgb, pil_pixels
from ._torchvision import one_line


@dataclass
class ImageSplit:
    """One split: ``labels[i]`` is the class of ``image(i)``; ``len(split)`` samples."""

    labels: np.ndarray  # int64 [N]
    load: Callable[[int], Image.Image]  # i -> image (any mode; converted to RGB by image())
    file: Callable[[int], Path] | None = None  # i -> the file load(i) decodes; None: images held in memory
    read: Callable[[int], bytes] | None = None  # i -> the image's bytes where file(i) only names them (a tar member)

    def __len__(self) -> int:
        return int(len(self.labels))

    def image(self, i: int) -> Image.Image:
        img = self.load(int(i))
        return img if img.mode == "RGB" else img.convert("RGB")

    def raw(self, i: int) -> bytes | None:
        """The bytes of image ``i``'s file, undecoded; None when the split holds its images in memory."""
        if self.file is None:
            return None
        if self.read is not None:
            return self.read(int(i))
        path = self.file(int(i))
        try:
            return Path(path).read_bytes()
        except OSError as e:
            raise UserError(f"cannot read image {path}: {one_line(e)}") from None

    def pixels(self, i: int) -> torch.Tensor:
        """Image ``i`` as uint8 RGB [3, H, W]: the pixels of ``image(i)``, decoded from ``raw(i)`` when a file."""
        data = self.raw(i)
        return pil_pixels(self.image(i)) if data is None else decode_rgb(data, self.file(int(i)))


@dataclass
class ImageDataset:
    """A named dataset: class names (index = label) and its splits ("train", "test", optional "val")."""

    name: str
    class_names: list[str]
    splits: dict[str, ImageSplit]
    source: str = ""  # where it was read from, for provenance
    extra: dict = field(default_factory=dict)

    def split(self, name: str) -> ImageSplit:
        if name not in self.splits:
            raise UserError(f"dataset {self.name!r} has no split {name!r}; it has: {', '.join(self.splits)}")
        return self.splits[name]


@dataclass(frozen=True)
class DatasetOptions(Options):
    """What a dataset build takes: ``arg`` (after the family prefix), ``root`` (the folder that holds its files;
    None: the entry's default places) and ``download`` (fetch what is missing, where the entry can)."""

    root: Path | None = None
    download: bool = False


class DatasetSpec(Spec):
    """A dataset entry: ``build(options: DatasetOptions) -> ImageDataset``."""

    Options = DatasetOptions
    downloadable: ClassVar[bool] = False  # whether ``download=True`` (--download) can fetch its files

    @classmethod
    def build(cls, options: DatasetOptions) -> ImageDataset:
        raise NotImplementedError(f"{cls.__name__} does not define build(options)")


DATASETS: Registry[type[DatasetSpec]] = Registry("dataset", base=DatasetSpec, group="mr2probe.datasets")


def require_dir(root: Path | None, what: str) -> Path:
    """Return ``root`` as a Path or raise a one-line UserError naming the missing folder."""
    if root is None:
        raise UserError(f"{what} needs --root DIR (the folder that holds its files)")
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"{what}: data folder {root} does not exist; pass --root to the folder that holds it")
    return root
