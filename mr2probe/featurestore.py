"""The feature store: cached features + labels + class names + provenance in one HDF5 file.

Layout (``../shared/spec/features.md``, also in the README)::

    /            attrs: format="mr2probe.features", format_version=1, encoder, dataset,
                        class_names (JSON list), created_utc, mr2probe_version, torch_version,
                        preprocessing (JSON), weights_sha256 (optional)
    /<split>/features  float16|float32 [N, D]   (split ∈ train, test, optional val)
    /<split>/labels    int64 [N] in [0, K)
    /<split>/index     int64 [N]  position in the source dataset
    /<split>           attrs: complete (bool), rows_written (int, resume point while writing)

Writers go to ``<path>.partial`` and rename when every split is complete, so a file at the final path is
always whole. Readers validate everything on open and raise one-line ``UserError`` s.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import h5py
import numpy as np

from .errors import UserError

FORMAT = "mr2probe.features"
FORMAT_VERSION = 1
SPLITS = ("train", "val", "test")
REQUIRED_SPLITS = ("train", "test")
CHUNK_ROWS = 1024


@dataclass
class Split:
    """One split in memory: features [N, D], labels [N], index [N]."""

    features: np.ndarray
    labels: np.ndarray
    index: np.ndarray

    def __len__(self) -> int:
        return int(len(self.labels))


@dataclass
class FeatureSet:
    """A validated feature file: attrs, class names and the splits that were loaded."""

    path: Path
    attrs: dict[str, Any]
    class_names: list[str]
    splits: dict[str, Split] = field(default_factory=dict)
    dim: int = 0

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def encoder(self) -> str:
        return str(self.attrs.get("encoder", ""))

    @property
    def dataset(self) -> str:
        return str(self.attrs.get("dataset", ""))


def _attr_str(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.generic):
        return v.item()
    return v


def _open(path: Path) -> h5py.File:
    path = Path(path)
    if not path.exists():
        partial = partial_path(path)
        hint = f" (an unfinished extraction is at {partial}: rerun the extract command to resume)" \
            if partial.exists() else ""
        raise UserError(f"feature file {path} not found{hint}")
    if path.is_dir():
        raise UserError(f"{path} is a folder, not a feature file")
    if path.stat().st_size == 0:
        raise UserError(f"feature file {path} is empty (0 bytes); extract it again")
    if not h5py.is_hdf5(str(path)):
        raise UserError(f"{path} is not an HDF5 file (truncated or another format); extract it again")
    try:
        return h5py.File(path, "r")
    except OSError as e:
        raise UserError(f"{path} is a corrupt HDF5 file ({str(e).splitlines()[0][:120]}); extract it again") \
            from None


def _check_header(f: h5py.File, path: Path) -> tuple[dict[str, Any], list[str]]:
    attrs = {k: _attr_str(v) for k, v in f.attrs.items()}
    if attrs.get("format") != FORMAT:
        raise UserError(f"{path}: attribute format is {attrs.get('format')!r}, expected {FORMAT!r} "
                        "(not an mr2probe feature file; see the README for the layout)")
    version = attrs.get("format_version")
    if not isinstance(version, (int, np.integer)) or isinstance(version, bool):
        raise UserError(f"{path}: format_version must be an integer, got {version!r}")
    if version > FORMAT_VERSION:
        raise UserError(f"{path}: format_version {version} is newer than this mr2probe reads ({FORMAT_VERSION}); "
                        "upgrade mr2probe")
    if version < 1:
        raise UserError(f"{path}: format_version {version} is invalid (must be ≥ 1)")
    try:
        names = json.loads(attrs.get("class_names", ""))
    except (TypeError, ValueError):
        names = None
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise UserError(f"{path}: class_names must be a JSON list of strings (one per class)")
    return attrs, names


def _split_arrays(f: h5py.File, path: Path, name: str) -> tuple[h5py.Dataset, h5py.Dataset, h5py.Dataset]:
    g = f[name]
    if not isinstance(g, h5py.Group):
        raise UserError(f"{path}: /{name} is not a group")
    for key in ("features", "labels", "index"):
        if key not in g or not isinstance(g[key], h5py.Dataset):
            raise UserError(f"{path}: split {name!r} has no dataset {key!r}")
    x, y, i = g["features"], g["labels"], g["index"]
    if x.ndim != 2 or x.shape[1] == 0:
        raise UserError(f"{path}: {name}/features must be 2-D [N, D], got shape {x.shape}")
    if x.dtype not in (np.float16, np.float32, np.float64):
        raise UserError(f"{path}: {name}/features must be float16 or float32, got {x.dtype}")
    if y.ndim != 1 or i.ndim != 1 or len(y) != x.shape[0] or len(i) != x.shape[0]:
        raise UserError(f"{path}: split {name!r} has {x.shape[0]} feature rows but labels {y.shape} "
                        f"and index {i.shape}")
    if y.dtype.kind not in "iu":
        raise UserError(f"{path}: {name}/labels must be integers, got {y.dtype}")
    if i.dtype.kind not in "iu":
        raise UserError(f"{path}: {name}/index must be integers, got {i.dtype}")
    return x, y, i


def _read_rows(ds: h5py.Dataset, path: Path, split: str) -> np.ndarray:
    try:
        return ds[()]
    except (OSError, RuntimeError, ValueError) as e:
        raise UserError(f"{path}: corrupt data in split {split!r} ({ds.name}): "
                        f"{str(e).splitlines()[0][:120]}; extract it again") from None


def read_features(path: str | Path, splits: Iterable[str] | None = None, load: bool = True) -> FeatureSet:
    """Open, validate and (if ``load``) read a feature file.

    Checks: format and version, class_names, train and test present, each split complete, same D in every
    split, float features, integer labels in [0, K), equal lengths, and (when loaded) no NaN/Inf."""
    path = Path(path)
    with _open(path) as f:
        attrs, names = _check_header(f, path)
        k = len(names)
        present = [s for s in SPLITS if s in f]
        for s in REQUIRED_SPLITS:
            if s not in f:
                raise UserError(f"{path}: required split {s!r} is missing (has: {', '.join(present) or 'none'})")
        wanted = list(splits) if splits is not None else present
        for s in wanted:
            if s not in f:
                raise UserError(f"{path}: split {s!r} is missing (has: {', '.join(present)})")
        dims = {}
        for s in present:
            x, _, _ = _split_arrays(f, path, s)
            dims[s] = x.shape[1]
            if not bool(f[s].attrs.get("complete", False)):
                raise UserError(f"{path}: split {s!r} is incomplete ({int(f[s].attrs.get('rows_written', 0))}/"
                                f"{x.shape[0]} rows); rerun the same extract command to resume it")
        if len(set(dims.values())) > 1:
            raise UserError(f"{path}: feature dimension differs between splits: "
                            + ", ".join(f"{s}={d}" for s, d in dims.items()))
        fs = FeatureSet(path=path, attrs=attrs, class_names=names, dim=next(iter(dims.values())))
        if not load:
            return fs
        for s in wanted:
            x, y, i = _split_arrays(f, path, s)
            feats = _read_rows(x, path, s)
            labels = _read_rows(y, path, s).astype(np.int64)
            index = _read_rows(i, path, s).astype(np.int64)
            if not np.isfinite(feats).all():
                bad = int((~np.isfinite(feats)).any(axis=1).sum())
                raise UserError(f"{path}: split {s!r} has NaN or Inf features in {bad} rows; "
                                "re-extract (with --dtype float32 if float16 overflowed)")
            if len(labels) and (labels.min() < 0 or labels.max() >= k):
                raise UserError(f"{path}: split {s!r} has labels outside [0, {k}) "
                                f"(min {labels.min()}, max {labels.max()}); class_names lists {k} classes")
            fs.splits[s] = Split(feats, labels, index)
    return fs


def check_classes_covered(fs: FeatureSet) -> None:
    """Training needs every class in train and (for per-class accuracy) in test."""
    k = fs.num_classes
    for s, what in (("train", "training samples"), ("test", "test samples")):
        if s in fs.splits:
            counts = np.bincount(fs.splits[s].labels, minlength=k)
            empty = np.flatnonzero(counts == 0)
            if len(empty):
                names = ", ".join(repr(fs.class_names[c]) for c in empty[:5])
                raise UserError(f"{fs.path}: class {names} has no {what} ({len(empty)} empty); "
                                "per-class results need every class in train and test")


def partial_path(path: Path) -> Path:
    return Path(str(path) + ".partial")


def base_attrs(encoder: str, dataset: str, class_names: list[str], preprocessing: dict | None = None,
               weights_sha256: str | None = None) -> dict[str, Any]:
    """The root attributes every feature file carries (provenance)."""
    import datetime

    import torch

    from . import __version__

    attrs = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "encoder": encoder, "dataset": dataset,
        "class_names": json.dumps(list(class_names)),
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "mr2probe_version": __version__, "torch_version": str(torch.__version__),
        "preprocessing": json.dumps(preprocessing or {}, sort_keys=True),
    }
    if weights_sha256:
        attrs["weights_sha256"] = weights_sha256
    return attrs


class FeatureWriter:
    """Resumable chunked writer. Rows go into preallocated datasets of ``<path>.partial``; each split records
    ``rows_written`` after every flushed chunk, and ``complete`` when done. ``finalize()`` renames to ``path``.

    Resuming: a partial file whose identity attrs (encoder, dataset, class_names, preprocessing, dtype) match
    is reopened and each split continues from ``rows_written``; otherwise it is an error unless ``overwrite``.
    """

    IDENTITY = ("encoder", "dataset", "class_names", "preprocessing", "weights_sha256", "feature_dtype")

    def __init__(self, path: str | Path, attrs: dict[str, Any], dim: int, dtype: str = "float16",
                 overwrite: bool = False) -> None:
        self.path = Path(path)
        self.partial = partial_path(self.path)
        self.dim, self.dtype = dim, np.dtype(dtype)
        attrs = dict(attrs, feature_dtype=str(self.dtype))
        if overwrite and self.partial.exists():
            self.partial.unlink()
        self.f = self._open_partial(attrs)

    def _open_partial(self, attrs: dict[str, Any]) -> h5py.File:
        if self.partial.exists():
            try:
                f = h5py.File(self.partial, "a")
            except OSError:
                self.partial.unlink()  # damaged by a kill mid-write: start over
                return self._open_partial(attrs)
            old = {k: _attr_str(f.attrs.get(k)) for k in self.IDENTITY}
            new = {k: attrs.get(k) for k in self.IDENTITY}
            if old != new:
                f.close()
                diff = [k for k in self.IDENTITY if old[k] != new[k]]
                raise UserError(f"{self.partial} is an unfinished extraction with other settings "
                                f"({', '.join(diff)} differ); pass --overwrite to start over")
            return f
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = h5py.File(self.partial, "w")
        for k, v in attrs.items():
            f.attrs[k] = v
        return f

    def rows_written(self, split: str) -> int:
        return int(self.f[split].attrs["rows_written"]) if split in self.f else 0

    def is_complete(self, split: str) -> bool:
        return split in self.f and bool(self.f[split].attrs["complete"])

    def begin(self, split: str, n: int) -> int:
        """Create the split's datasets for ``n`` rows (if new); return the row to resume from."""
        if split not in self.f:
            g = self.f.create_group(split)
            chunk = (min(CHUNK_ROWS, max(n, 1)), self.dim)
            g.create_dataset("features", (n, self.dim), dtype=self.dtype, chunks=chunk)
            g.create_dataset("labels", (n,), dtype=np.int64)
            g.create_dataset("index", (n,), dtype=np.int64)
            g.attrs["complete"] = False
            g.attrs["rows_written"] = 0
        elif self.f[split]["features"].shape[0] != n:
            raise UserError(f"{self.partial}: split {split!r} was started with "
                            f"{self.f[split]['features'].shape[0]} rows, now {n}; pass --overwrite")
        return self.rows_written(split)

    def write(self, split: str, start: int, features: np.ndarray, labels: np.ndarray, index: np.ndarray) -> None:
        """Write rows [start, start+len) and advance the resume point (flushed before it moves)."""
        g, stop = self.f[split], start + len(labels)
        if not np.isfinite(features).all():
            raise UserError(f"encoder produced NaN/Inf features in split {split!r} rows {start}..{stop}")
        g["features"][start:stop] = features.astype(self.dtype, copy=False)
        g["labels"][start:stop] = labels
        g["index"][start:stop] = index
        self.f.flush()
        g.attrs["rows_written"] = stop
        self.f.flush()

    def end(self, split: str) -> None:
        g = self.f[split]
        if int(g.attrs["rows_written"]) != g["features"].shape[0]:
            raise RuntimeError(f"split {split} ended early")
        g.attrs["complete"] = True
        self.f.flush()

    def finalize(self) -> Path:
        """Close and atomically rename ``.partial`` → final path."""
        self.f.close()
        os.replace(self.partial, self.path)
        return self.path

    def close(self) -> None:
        if self.f.id.valid:
            self.f.close()


def write_features(path: str | Path, attrs: dict[str, Any], splits: dict[str, Split | tuple],
                   dtype: str = "float32") -> Path:
    """Write a whole feature file at once (atomically). ``splits`` maps name → Split or (X, y, index)."""
    items = {s: v if isinstance(v, Split) else Split(*v) for s, v in splits.items()}
    dim = next(iter(items.values())).features.shape[1]
    w = FeatureWriter(path, attrs, dim, dtype, overwrite=True)
    try:
        for s, sp in items.items():
            w.begin(s, len(sp))
            w.write(s, 0, np.asarray(sp.features), np.asarray(sp.labels), np.asarray(sp.index))
            w.end(s)
        return w.finalize()
    except BaseException:
        w.close()
        w.partial.unlink(missing_ok=True)
        raise


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def describe(path: str | Path) -> dict[str, Any]:
    """What ``mr2probe info`` prints: layout, per-split and per-class counts, dim, dtype, provenance."""
    fs = read_features(path, load=False)
    out: dict[str, Any] = {"path": str(fs.path), "attrs": fs.attrs, "dim": fs.dim,
                           "num_classes": fs.num_classes, "splits": {}}
    with h5py.File(fs.path, "r") as f:
        for s in SPLITS:
            if s in f:
                y = f[s]["labels"][()]
                out["splits"][s] = {"rows": int(len(y)), "dtype": str(f[s]["features"].dtype),
                                    "chunks": f[s]["features"].chunks, "complete": bool(f[s].attrs["complete"]),
                                    "per_class": np.bincount(y, minlength=fs.num_classes).tolist()}
    return out
