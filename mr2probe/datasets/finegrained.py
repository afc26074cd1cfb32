"""Fine-grained transfer sets read through torchvision from ``--root``: Flowers-102, Oxford-IIIT Pets, Food-101,
Stanford Cars, FGVC-Aircraft and DTD, each with its official splits (val where the dataset defines one).

torchvision builds these from annotation files only, so labels are read from its per-sample label lists without
decoding a single image: ``_labels``, or ``_samples`` for Stanford Cars (private attributes, as of torchvision 0.29;
a missing one fails loudly). The image files come from ``_image_files``, ``_images`` or ``_samples`` likewise, so
extraction can read their bytes and decode them where it resizes (without them it decodes through torchvision).
Class names are torchvision's ``classes``; Flowers102 carries the standard 102 flower names as a class attribute,
and a torchvision without it gets "flower_<i>". ``download=True`` is passed through to torchvision, except for
Stanford Cars, whose download URL is gone.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UserError
from ._base import DATASETS, DatasetOptions, DatasetSpec, ImageDataset, ImageSplit
from ._torchvision import dataset_root, user_errors


@dataclass(frozen=True)
class _Spec:
    name: str
    torchvision_class: str
    splits: dict[str, str]  # our split name -> torchvision's split argument
    layout: str  # what --root must hold, for error messages
    help: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    downloadable: bool = True
    fallback_names: tuple[str, ...] = ()  # used only if this torchvision has no ``classes`` for the dataset


SPECS = [
    _Spec("flowers102", "Flowers102", {"train": "train", "val": "val", "test": "test"},
          "flowers-102/{jpg/,imagelabels.mat,setid.mat}",
          "Oxford Flowers-102, 102 classes, 1020/1020/6149 train/val/test (torchvision layout under --root)",
          fallback_names=tuple(f"flower_{i}" for i in range(102))),
    _Spec("oxford-pets", "OxfordIIITPet", {"train": "trainval", "test": "test"},
          "oxford-iiit-pet/{images/,annotations/}",
          "Oxford-IIIT Pets, 37 breeds, 3680/3669 trainval/test (torchvision layout under --root)",
          {"target_types": "category"}),
    _Spec("food101", "Food101", {"train": "train", "test": "test"}, "food-101/{images/,meta/}",
          "Food-101, 101 classes, 75750/25250 train/test (torchvision layout under --root)"),
    _Spec("stanford-cars", "StanfordCars", {"train": "train", "test": "test"},
          "stanford_cars/{devkit/,cars_train/,cars_test/,cars_test_annos_withlabels.mat}",
          "Stanford Cars, 196 classes, 8144/8041 train/test (torchvision layout under --root; no download)",
          downloadable=False),
    _Spec("fgvc-aircraft", "FGVCAircraft", {"train": "train", "val": "val", "test": "test"},
          "fgvc-aircraft-2013b/data/{images/,variants.txt,images_variant_*.txt}",
          "FGVC-Aircraft, 100 variants, 3334/3333/3333 train/val/test (torchvision layout under --root)",
          {"annotation_level": "variant"}),
    _Spec("dtd", "DTD", {"train": "train", "val": "val", "test": "test"}, "dtd/dtd/{images/,labels/}",
          "Describable Textures, 47 classes, 1880/1880/1880 train/val/test, partition 1 (torchvision layout)",
          {"partition": 1}),
]


def sample_labels(ds: Any) -> np.ndarray:
    """The label of every sample of a torchvision dataset, read from its annotation lists (no image decoding)."""
    if hasattr(ds, "_labels"):
        return np.asarray(ds._labels, dtype=np.int64)
    if hasattr(ds, "_samples"):  # StanfordCars: [(path, label)]
        return np.asarray([label for _, label in ds._samples], dtype=np.int64)
    if hasattr(ds, "targets"):
        return np.asarray(ds.targets, dtype=np.int64)
    raise TypeError(f"{type(ds).__name__}: no _labels/_samples/targets attribute (torchvision version changed?)")


def sample_files(ds: Any) -> list[str] | None:
    """The image file of every sample of a torchvision dataset (``_image_files``, ``_images`` or, for Stanford
    Cars, ``_samples``), None when it lists none of them."""
    for key in ("_image_files", "_images"):
        if isinstance(getattr(ds, key, None), list):
            return [str(f) for f in getattr(ds, key)]
    if isinstance(getattr(ds, "_samples", None), list):
        return [str(path) for path, _ in ds._samples]
    return None


def _split(ds: Any) -> ImageSplit:
    files = sample_files(ds)
    return ImageSplit(labels=sample_labels(ds), load=lambda i: ds[i][0],
                      file=None if files is None else lambda i: Path(files[i]))


def load_torchvision(spec: _Spec, root: Path | None, download: bool) -> ImageDataset:
    """Build every split of ``spec`` with torchvision; class names must agree across splits."""
    import torchvision.datasets as tvd

    root = dataset_root(root, download, spec.name, spec.layout, spec.downloadable)
    download = download and spec.downloadable  # StanfordCars.download() always raises
    cls = getattr(tvd, spec.torchvision_class)
    splits: dict[str, ImageSplit] = {}
    class_names: list[str] | None = None
    for ours, theirs in spec.splits.items():
        with user_errors(spec.name, root, spec.layout, download, spec.downloadable):
            ds = cls(str(root), split=theirs, download=download, **spec.kwargs)
        names = [str(c) for c in (getattr(ds, "classes", None) or spec.fallback_names)]
        if class_names is not None and names != class_names:
            raise UserError(f"{spec.name}: split {ours!r} under {root} has {len(names)} classes but the train split "
                            f"has {len(class_names)}; the annotation files are incomplete")
        class_names = names
        splits[ours] = _split(ds)
        if len(splits[ours]) and splits[ours].labels.max() >= len(names):
            raise UserError(f"{spec.name}: split {ours!r} has labels beyond its {len(names)} classes")
    assert class_names is not None
    return ImageDataset(name=spec.name, class_names=class_names, splits=splits, source=str(root))


class _TorchvisionSet(DatasetSpec):
    """A fine-grained set read through torchvision (``layout``: its ``_Spec``)."""

    layout: _Spec

    @classmethod
    def build(cls, options: DatasetOptions) -> ImageDataset:
        return load_torchvision(cls.layout, options.root, options.download)


for _spec in SPECS:
    DATASETS.register(_spec.name)(type(_spec.torchvision_class, (_TorchvisionSet,),
                                       {"__doc__": _spec.help, "layout": _spec,
                                                              "downloadable": _spec.downloadable}))
