"""Class-folder trees (``split/<class>/**/*.jpg``), scanned the way torchvision's ImageFolder does.

Classes are sorted folder names; samples are listed class by class, walking each class folder (links followed) in
sorted order and keeping files with an image extension, so indices match ``ImageFolder`` on the same tree (except
that hidden files and folders, such as macOS ``._x.jpg`` droppings, are skipped). Only relative paths are stored;
images are decoded on demand.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image

from ..errors import UserError
from ._base import ImageSplit
from ._torchvision import one_line

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def class_folders(split_dir: Path) -> list[str]:
    """Sorted names of the visible subfolders of ``split_dir``."""
    return sorted(e.name for e in os.scandir(split_dir) if e.is_dir() and not e.name.startswith("."))


def image_files(folder: Path) -> list[str]:
    """Image files under ``folder`` (recursive), as paths relative to ``folder``, in ImageFolder order."""
    walked = []
    for here, dirs, files in os.walk(folder, followlinks=True):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        walked.append((here, files))
    found: list[str] = []
    for here, files in sorted(walked, key=lambda entry: entry[0]):
        rel = os.path.relpath(here, folder)
        found += [os.path.normpath(os.path.join(rel, f)) for f in sorted(files)
                  if f.lower().endswith(IMAGE_EXTENSIONS) and not f.startswith(".")]
    return found


def open_image(path: str | Path) -> Image.Image:
    """Decode one image file fully (the file is closed on return)."""
    try:
        with Image.open(path) as img:
            img.load()
            return img
    except OSError as e:
        raise UserError(f"cannot read image {path}: {one_line(e)}") from None


def folder_split(split_dir: Path, classes: list[str], what: str, require_all: bool = False) -> ImageSplit:
    """The samples of ``split_dir/<class>/``, labelled by index in ``classes``.

    A class folder not in ``classes`` is an error; with ``require_all`` every class needs at least one image.
    """
    index = {c: i for i, c in enumerate(classes)}
    present = class_folders(split_dir)
    unknown = [c for c in present if c not in index]
    if unknown:
        shown = ", ".join(unknown[:5]) + (", ..." if len(unknown) > 5 else "")
        raise UserError(f"{what}: {split_dir} has class folders that train/ lacks: {shown}")
    paths: list[str] = []
    labels: list[int] = []
    for name in present:
        files = image_files(split_dir / name)
        if require_all and not files:
            raise UserError(f"{what}: class folder {split_dir / name} has no images ({', '.join(IMAGE_EXTENSIONS)})")
        paths += [os.path.join(name, f) for f in files]
        labels += [index[name]] * len(files)
    if not paths:
        raise UserError(f"{what}: no images in class folders under {split_dir} (expected {split_dir}/<class>/*.jpg)")
    return ImageSplit(labels=np.asarray(labels, dtype=np.int64), load=lambda i: open_image(split_dir / paths[i]),
                      file=lambda i: split_dir / paths[i])
