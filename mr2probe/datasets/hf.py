"""Hugging Face ``datasets``: ``hf:PATH_OR_NAME`` reads a ``DatasetDict``, either a folder written by
``DatasetDict.save_to_disk`` or, for users online, a hub dataset (``datasets.load_dataset``).

Options follow the path or name, comma-separated: ``hf:NAME,image=img,label=fine_label,config=NAME,train=SPLIT,
val=SPLIT,test=SPLIT``. The image column (default ``image``) must be a ``datasets.Image`` feature and the label column
(default ``label``) a ``ClassLabel``, whose names are the class names. Splits map to ours as ``train`` → train,
``validation`` / ``val`` / ``valid`` / ``dev`` → val, ``test`` → test unless ``train=`` / ``val=`` / ``test=`` name
them (e.g. ``test=validation`` where the hub's test labels are hidden); other splits are not used. With no PATH,
``hf:`` reads the folder given by ``--root``; a relative PATH is looked up under ``--root`` when it is there.

Labels are read from the label column without decoding any image; images are decoded one at a time. ``datasets``
is an optional dependency (``pip install 'mr2probe[hf]'``), imported only when an ``hf:`` dataset is built.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UserError
from ._base import DATASETS, DatasetOptions, DatasetSpec, ImageDataset, ImageSplit
from ._torchvision import one_line

OPTIONS = ("image", "label", "config", "train", "val", "test")
SPLIT_NAMES = {"train": ("train",), "val": ("validation", "val", "valid", "dev"), "test": ("test",)}
USAGE = "hf:PATH_OR_NAME[,image=COLUMN][,label=COLUMN][,config=NAME][,train=|val=|test=SPLIT]"


def parse_spec(arg: str) -> tuple[str, dict[str, str]]:
    """``"a/b,label=fine"`` → ("a/b", {"label": "fine"}): trailing ``key=value`` items with a known key are options
    (so a path may itself contain commas)."""
    parts = arg.split(",")
    options: dict[str, str] = {}
    while len(parts) > 1:
        key, eq, value = parts[-1].partition("=")
        if not eq or key.strip() not in OPTIONS:
            break
        if not value.strip():
            raise UserError(f"hf: option {key.strip()}= needs a value in hf:{arg}; expected {USAGE}")
        options.setdefault(key.strip(), value.strip())
        parts.pop()
    return ",".join(parts).strip(), options


def _import_datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise UserError("hf: datasets need the Hugging Face `datasets` package: pip install 'mr2probe[hf]' "
                        "(or pip install datasets)") from None
    return datasets


def _open(spec: str, root: Path | None, config: str | None) -> tuple[Any, str]:
    """The DatasetDict of ``spec`` (local save_to_disk folder, else a hub name) and where it came from."""
    datasets = _import_datasets()
    local = Path(spec).expanduser() if spec else root
    if local is None:
        raise UserError(f"hf: needs a path or hub name (hf:PATH_OR_NAME) or --root DIR; expected {USAGE}")
    if spec and root is not None and not local.is_absolute() and not local.exists() and (root / local).exists():
        local = root / local
    if local.exists():
        if not local.is_dir():
            raise UserError(f"hf: {local} is a file; pass the folder DatasetDict.save_to_disk wrote")
        if (local / "state.json").is_file() and not (local / "dataset_dict.json").is_file():
            raise UserError(f"hf: {local} holds a single Dataset, not a DatasetDict with train and test splits; "
                            "save DatasetDict({'train': ..., 'test': ...}) instead")
        if not (local / "dataset_dict.json").is_file():
            raise UserError(f"hf: {local} is not a DatasetDict.save_to_disk folder (it has no dataset_dict.json)")
        try:
            return datasets.load_from_disk(str(local)), f"{local} (Hugging Face DatasetDict.save_to_disk folder)"
        except (OSError, ValueError, KeyError, RuntimeError) as e:
            raise UserError(f"hf: cannot read {local}: {one_line(e)}") from None
    if not spec or spec.startswith(("/", ".", "~")) or "\\" in spec or spec.count("/") > 1:
        raise UserError(f"hf: {local} does not exist (expected a DatasetDict.save_to_disk folder or a hub name "
                        "such as uoft-cs/cifar10)")
    try:  # a hub dataset: this is the one place that goes online
        data = datasets.load_dataset(spec, config) if config else datasets.load_dataset(spec)
    except (OSError, ValueError, RuntimeError, KeyError) as e:
        raise UserError(f"hf: cannot load {spec!r} from the Hugging Face hub: {one_line(e)}") from None
    return data, f"huggingface hub {spec}" + (f" (config {config})" if config else "")


def _pick_splits(data: Any, options: dict[str, str], what: str) -> dict[str, str]:
    """Our split → their split name."""
    have = list(data.keys())
    chosen: dict[str, str] = {}
    for ours, names in SPLIT_NAMES.items():
        if ours in options:
            if options[ours] not in have:
                raise UserError(f"{what}: {ours}={options[ours]} is not a split of it (it has: {', '.join(have)})")
            chosen[ours] = options[ours]
        else:
            found = [n for n in names if n in have]
            if found:
                chosen[ours] = found[0]
    for ours in ("train", "test"):
        if ours not in chosen:
            raise UserError(f"{what}: no {ours!r} split (it has: {', '.join(have) or 'none'}); name one with "
                            f"{ours}=SPLIT, or split it yourself (Dataset.train_test_split) and save a DatasetDict")
    return chosen


def _split(ds: Any, image: str, label: str, what: str, theirs: str) -> ImageSplit:
    datasets = _import_datasets()
    columns = list(ds.features)
    for role, col in (("image", image), ("label", label)):
        if col not in ds.features:
            raise UserError(f"{what}: split {theirs!r} has no {role} column {col!r} (columns: {', '.join(columns)}); "
                            f"pass hf:...,{role}=COLUMN")
    if not isinstance(ds.features[image], datasets.Image):
        raise UserError(f"{what}: column {image!r} is {type(ds.features[image]).__name__}, not an Image feature; "
                        "pass hf:...,image=COLUMN")
    if not isinstance(ds.features[label], datasets.ClassLabel):
        raise UserError(f"{what}: column {label!r} is {type(ds.features[label]).__name__}, not a ClassLabel "
                        "(class names come from it); cast it with Dataset.class_encode_column or pass label=COLUMN")
    labels = np.asarray(ds[label], dtype=np.int64)
    k = ds.features[label].num_classes
    if len(labels) and labels.min() < 0:
        raise UserError(f"{what}: split {theirs!r} has {int((labels < 0).sum())} unlabelled samples (label "
                        f"{labels.min()}); map a labelled split instead, e.g. hf:...,test=validation")
    if len(labels) and labels.max() >= k:
        raise UserError(f"{what}: split {theirs!r} has labels up to {labels.max()} but its ClassLabel has {k} names")
    if not ds.features[image].decode:
        ds = ds.cast_column(image, datasets.Image())
    images = ds.select_columns([image])

    def load(i: int) -> Any:
        img = images[int(i)][image]
        if img is None:
            raise UserError(f"{what}: split {theirs!r} row {i} has no image")
        return img

    return ImageSplit(labels=labels, load=load)


@DATASETS.register("hf:", help="Hugging Face DatasetDict: hf:SAVE_TO_DISK_FOLDER or hf:HUB_NAME[,image=COL]"
                               "[,label=COL][,config=NAME][,test=SPLIT] (needs `pip install datasets`)")
class HuggingFace(DatasetSpec):
    """A Hugging Face DatasetDict (save_to_disk folder or hub name) with an Image and a ClassLabel column."""

    @classmethod
    def build(cls, options: DatasetOptions) -> ImageDataset:
        return load_hf(options.arg, options.root)


def load_hf(arg: str, root: Path | None) -> ImageDataset:
    """The DatasetDict ``arg`` names (see :func:`parse_spec`), opened under ``root`` where a folder."""
    spec, options = parse_spec(arg)
    what = f"hf:{arg}"
    data, source = _open(spec, root, options.get("config"))
    if not hasattr(data, "keys"):
        raise UserError(f"{what}: is a single Dataset, not a DatasetDict with train and test splits")
    image, label = options.get("image", "image"), options.get("label", "label")
    chosen = _pick_splits(data, options, what)
    splits = {ours: _split(data[theirs], image, label, what, theirs) for ours, theirs in chosen.items()}
    names = {theirs: list(data[theirs].features[label].names) for theirs in chosen.values()}
    class_names = names[chosen["train"]]
    for theirs, n in names.items():
        if n != class_names:
            raise UserError(f"{what}: split {theirs!r} has other ClassLabel names than {chosen['train']!r} "
                            f"({len(n)} vs {len(class_names)} classes)")
    mapping = ", ".join(f"{ours}←{theirs}" for ours, theirs in chosen.items())
    return ImageDataset(name=what, class_names=[str(c) for c in class_names], splits=splits,
                        source=f"{source}; splits {mapping}; image column {image!r}, label column {label!r}",
                        extra={"hf_splits": chosen})
