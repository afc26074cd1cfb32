"""WebDataset tar shards: ``wds:SPEC``, read with the standard library's ``tarfile`` (no extra dependency).

A shard is an uncompressed tar file whose members are grouped into samples by key, as WebDataset writes them:
``KEY.EXT`` (the key is the member's path up to the first dot of its file name, the extension the rest, compared
in lower case), e.g. ``000123.jpg`` + ``000123.cls``. A sample needs one image (the first of ``jpg jpeg png webp
ppm bmp tif tiff`` it has, or the extension ``image=`` names) and one label file (``cls`` unless ``label=`` names
another); other members (``json``, ``txt`` ...) are ignored. Samples keep shard order, then tar order.

SPEC names the shards of each split:

* ``wds:train=PATTERN,test=PATTERN[,val=PATTERN]``, e.g.
  ``wds:train=shards/train-{000000..000003}.tar,test=shards/test-{000000..000000}.tar``;
* ``wds:PATTERN`` with ``{split}`` in it, e.g. ``wds:shards/{split}-{000000..000003}.tar``: the pattern with
  ``train``, ``val`` and ``test`` put in (val may have no shards; train and test must);
* ``wds:`` with no pattern: ``--root``'s ``{split}-*.tar`` files (``train-*.tar``, ``val-*.tar``, ``test-*.tar``).

A PATTERN expands ``{a..b}`` (integer ranges, zero-padded to ``a``'s width, WebDataset's brace notation) and
``{x,y}`` lists, then ``*`` / ``?`` globs (sorted); a relative pattern is read under ``--root`` when given. Every
shard a pattern names must exist. Options after the patterns, comma-separated: ``image=EXT``, ``label=EXT``,
``classes=FILE`` (class names, one per line, line i = class i).

Labels: when every label file holds an integer (WebDataset's ``cls`` convention) it is the class index, and the
class names are ``classes=FILE``'s lines or ``"0" … "K−1"`` (K = the largest index + 1); otherwise the label text
(stripped) is the class name, classes are the sorted names of the train split's labels (as ImageFolder sorts its
folders), and val/test may not have a class train lacks. Labels are read while the shards are indexed (the tar
headers and the small label members); images are read by offset from the shard when extraction asks for them.
"""
from __future__ import annotations

import glob
import io
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from ..errors import UserError
from ._base import DATASETS, DatasetOptions, DatasetSpec, ImageDataset, ImageSplit
from ._torchvision import one_line

SPLITS = ("train", "val", "test")
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "ppm", "bmp", "tif", "tiff")
OPTIONS = ("image", "label", "classes")
USAGE = ("wds:train=PATTERN,test=PATTERN[,val=PATTERN] or wds:PATTERN_WITH_{split} (e.g. "
         "wds:shards/{split}-{000000..000003}.tar)[,image=EXT][,label=EXT][,classes=FILE]")
_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")
_LIST = re.compile(r"\{([^{}]*,[^{}]*)\}")


def expand_braces(pattern: str) -> list[str]:
    """``a-{00..02}.tar`` → ``a-00.tar a-01.tar a-02.tar``; ``{x,y}`` → x, y (the first brace first, recursively)."""
    found = [m for m in (_RANGE.search(pattern), _LIST.search(pattern)) if m]
    if not found:
        return [pattern]
    m = min(found, key=lambda match: match.start())
    if m.re is _RANGE:
        lo, hi = int(m.group(1)), int(m.group(2))
        if hi < lo:
            raise UserError(f"wds: the range {m.group(0)} in {pattern} is empty (it counts down)")
        values = [str(v).zfill(len(m.group(1))) for v in range(lo, hi + 1)]
    else:
        values = m.group(1).split(",")
    return [out for v in values for out in expand_braces(pattern[:m.start()] + v + pattern[m.end():])]


def parse_spec(arg: str) -> tuple[dict[str, str], dict[str, str], bool]:
    """``"train=a.tar,test=b.tar,label=txt"`` → ({"train": "a.tar", "test": "b.tar"}, {"label": "txt"}, False);
    ``"{split}-0.tar"`` → a pattern per split, ``""`` → ``{split}-*.tar`` of each split (val optional: True)."""
    items = [p for p in re.split(r",(?=\s*(?:train|val|test|image|label|classes)=)", arg) if p.strip()]
    patterns: dict[str, str] = {}
    options: dict[str, str] = {}
    val_optional = False
    for i, item in enumerate(items):
        key, eq, value = item.partition("=")
        key = key.strip()
        if eq and key in SPLITS + OPTIONS:
            if not value.strip():
                raise UserError(f"wds: {key}= needs a value in wds:{arg}; expected {USAGE}")
            (patterns if key in SPLITS else options)[key] = value.strip()
        elif i == 0:
            if "{split}" not in item:
                raise UserError(f"wds: the pattern {item!r} has no {{split}}; name each split's shards instead: "
                                f"{USAGE}")
            patterns.update({s: item.strip().replace("{split}", s) for s in SPLITS})
            val_optional = True
        else:
            raise UserError(f"wds: cannot read {item!r} in wds:{arg}; expected {USAGE}")
    if not patterns:
        patterns, val_optional = {s: f"{s}-*.tar" for s in SPLITS}, True
    return patterns, options, val_optional


def shard_paths(pattern: str, root: Path | None, required: bool) -> list[Path]:
    """The shards ``pattern`` names (braces expanded, then globs), relative ones under ``root``; a named shard
    that is missing is an error unless none is there and the split is not ``required``."""
    found: list[Path] = []
    missing: list[Path] = []
    for item in expand_braces(pattern):
        path = Path(item).expanduser()
        if root is not None and not path.is_absolute():
            path = root / path
        if glob.has_magic(str(path)):
            found += sorted(Path(p) for p in glob.glob(str(path)))
        else:
            (found if path.is_file() else missing).append(path)
    if missing and (found or required):
        raise UserError(f"wds: shard {missing[0]} not found (from the pattern {pattern})")
    if not found and required:
        where = f" under {root}" if root is not None else ""
        raise UserError(f"wds: no shards match {pattern}{where}")
    return found


@dataclass
class _Sample:
    shard: int
    image: tarfile.TarInfo
    label: str


def _split_name(member: str) -> tuple[str, str]:
    """A member path → (key, extension): the key ends at the first dot of the file name."""
    folder, _, name = member.rpartition("/")
    stem, _, ext = name.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext.lower()


def index_shard(path: Path, shard: int, image_ext: str | None, label_ext: str) -> list[_Sample]:
    """The samples of one shard, in tar order (labels read, images only located)."""
    try:
        tar = tarfile.open(path, "r:")
    except (tarfile.TarError, OSError) as e:
        raise UserError(f"wds: cannot read shard {path} (an uncompressed tar is needed): {one_line(e)}") from None
    with tar:
        groups: dict[str, dict[str, tarfile.TarInfo]] = {}
        for member in tar:
            if member.isfile():
                key, ext = _split_name(member.name)
                groups.setdefault(key, {})[ext] = member
        samples = []
        for key, files in groups.items():
            image = files.get(image_ext) if image_ext else next((files[e] for e in IMAGE_EXTENSIONS if e in files),
                                                               None)
            if image is None or label_ext not in files:
                missing = (f"a .{label_ext} label file" if image is not None
                           else f"an image ({image_ext or ', '.join(IMAGE_EXTENSIONS)})")
                raise UserError(f"wds: sample {key!r} of shard {path} lacks {missing} (it has: "
                                f"{', '.join(sorted(files))}); name others with image=EXT / label=EXT")
            label = tar.extractfile(files[label_ext]).read().decode("utf-8", "replace").strip()
            samples.append(_Sample(shard, image, label))
    return samples


def _read_member(path: Path, member: tarfile.TarInfo) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(member.offset_data)
            data = f.read(member.size)
    except OSError as e:
        raise UserError(f"cannot read image {path}:{member.name}: {one_line(e)}") from None
    if len(data) != member.size:
        raise UserError(f"cannot read image {path}:{member.name}: the shard is truncated")
    return data


def _open_image(data: bytes, name: Path) -> Image.Image:
    """One image decoded fully from its bytes (``name`` for the error line)."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            return img
    except (OSError, Image.DecompressionBombError, ValueError) as e:
        raise UserError(f"cannot read image {name}: {one_line(e)}") from None


def _split(shards: list[Path], samples: list[_Sample], labels: np.ndarray) -> ImageSplit:
    def read(i: int) -> bytes:
        s = samples[int(i)]
        return _read_member(shards[s.shard], s.image)

    def name(i: int) -> Path:
        s = samples[int(i)]
        return Path(f"{shards[s.shard]}:{s.image.name}")

    return ImageSplit(labels=labels, load=lambda i: _open_image(read(i), name(i)), file=name, read=read)


def _class_names(labels: dict[str, list[str]], classes_file: Path | None, what: str) -> tuple[list[str], dict]:
    """Class names and each split's label indices (see the module doc)."""
    if all(text.lstrip("-").isdigit() for texts in labels.values() for text in texts):
        ints = {s: np.asarray([int(t) for t in texts], dtype=np.int64) for s, texts in labels.items()}
        low = min(int(v.min()) for v in ints.values() if len(v))
        top = max(int(v.max()) for v in ints.values() if len(v)) + 1
        if low < 0:
            raise UserError(f"{what}: a label file holds the negative class {low}")
        names = [str(c) for c in range(top)]
        if classes_file is not None:
            names = [line.strip() for line in classes_file.read_text().splitlines() if line.strip()]
            if len(names) < top:
                raise UserError(f"{what}: {classes_file} names {len(names)} classes, the labels go up to {top - 1}")
        return names, ints
    names = sorted(set(labels["train"]))
    index = {c: i for i, c in enumerate(names)}
    for s, texts in labels.items():
        unknown = sorted(set(texts) - set(index))
        if unknown:
            raise UserError(f"{what}: split {s} has labels the train split lacks: {', '.join(unknown[:5])}")
    return names, {s: np.asarray([index[t] for t in texts], dtype=np.int64) for s, texts in labels.items()}


@DATASETS.register("wds:", help="WebDataset tar shards (image + .cls per sample): wds:train=PATTERN,test=PATTERN"
                                "[,val=PATTERN] or wds:DIR_PATTERN/{split}-{000000..000003}.tar (under --root)")
class WebDataset(DatasetSpec):
    """WebDataset tar shards per split (image + class file per sample), read with tarfile."""

    @classmethod
    def build(cls, options: DatasetOptions) -> ImageDataset:
        return load_wds(options.arg, options.root)


def load_wds(arg: str, root: Path | None) -> ImageDataset:
    """The shards ``arg`` names (see :func:`parse_spec`), relative patterns under ``root``."""
    what = f"wds:{arg}"
    patterns, options, val_optional = parse_spec(arg)
    for s in ("train", "test"):
        if s not in patterns:
            raise UserError(f"{what}: no {s}= shards; expected {USAGE}")
    classes_file = None
    if "classes" in options:
        classes_file = Path(options["classes"]).expanduser()
        if root is not None and not classes_file.is_absolute() and not classes_file.exists():
            classes_file = root / classes_file
        if not classes_file.is_file():
            raise UserError(f"{what}: classes file {classes_file} not found")
    image_ext, label_ext = options.get("image"), options.get("label", "cls")
    shards, samples, texts = {}, {}, {}
    for s, pattern in patterns.items():
        paths = shard_paths(pattern, root, required=not (s == "val" and val_optional))
        if not paths:
            continue
        found = [x for i, p in enumerate(paths) for x in index_shard(p, i, image_ext, label_ext)]
        if not found:
            raise UserError(f"{what}: the {s} shards ({pattern}) hold no samples")
        shards[s], samples[s], texts[s] = paths, found, [x.label for x in found]
    names, labels = _class_names(texts, classes_file, what)
    splits = {s: _split(shards[s], samples[s], labels[s]) for s in shards}
    counts = "; ".join(f"{s} {len(samples[s])} samples in {len(shards[s])} shards ({patterns[s]})" for s in shards)
    return ImageDataset(name=what, class_names=names, splits=splits,
                        source=f"WebDataset tar shards{f' under {root}' if root else ''}: {counts}")
