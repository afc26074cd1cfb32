"""The feature store: cached features + labels + class names + provenance in one HDF5 file.

Layout (``../shared/spec/features.md``, also in the README)::

    /            attrs: format="mr2probe.features", format_version=1, encoder, dataset,
                        class_names (JSON list), created_utc, mr2probe_version, torch_version,
                        preprocessing (JSON), weights_sha256 (optional)
    /<split>/features  float16|float32 [N, D]   (split ∈ train, test, optional val)
    /<split>/labels    int64 [N] in [0, K)
    /<split>/index     int64 [N]  position in the source dataset
    /<split>/source    str [N]    optional: each row's source (an image file's path relative to the dataset root,
                                  a WebDataset key, or "dataset:split:index"); files without it read as
                                  "split:index" (:func:`row_sources`)
    /<split>           attrs: complete (bool), rows_written (int, resume point while writing)

Writers go to ``<path>.partial`` and rename when every split is complete, so a file at the final path is
always whole. :class:`FeatureWriter` also records feature_dtype (and, from ``mr2probe extract``: source, subset,
autocast) and chunks every dataset by rows with HDF5's fletcher32 checksum, so a damaged chunk is reported on
read. Readers validate everything on open and raise one-line ``UserError`` s.
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
SOURCE = "source"  # the optional per-row source dataset of a split


@dataclass
class Split:
    """One split in memory: features [N, D] (None when read with ``load="labels"``), labels [N], index [N];
    ``source`` [N] str, each row's source, when it is to be written (:func:`row_sources` reads it)."""

    features: np.ndarray | None
    labels: np.ndarray
    index: np.ndarray
    source: np.ndarray | None = None

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
    rows: dict[str, int] = field(default_factory=dict)  # rows of every split in the file (loaded or not)

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
        return v.decode("utf-8", "replace")  # a damaged or foreign attribute is reported, not a crash
    if isinstance(v, np.generic):
        return v.item()
    return v


def _open(path: Path) -> h5py.File:
    path = Path(path)
    if not path.exists():
        partial = partial_path(path)
        hint = f" (an unfinished extraction is at {partial}: rerun the extract command to resume)" \
            if partial.exists() else "; check the path, or write it with `mr2probe extract`"
        raise UserError(f"feature file {path} not found{hint}")
    if path.is_dir():
        raise UserError(f"{path} is a folder, not a feature file; pass the .h5 file itself")
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
    if not isinstance(attrs.get("format"), str) or attrs["format"] != FORMAT:
        raise UserError(f"{path}: attribute format is {attrs.get('format')!r}, expected {FORMAT!r} "
                        "(not an mr2probe feature file; see the README for the layout)")
    version = attrs.get("format_version")
    if not isinstance(version, (int, np.integer)) or isinstance(version, bool):
        raise UserError(f"{path}: format_version must be an integer, got {version!r} (not a file mr2probe wrote, or a "
                        "damaged one); extract it again")
    if version > FORMAT_VERSION:
        raise UserError(f"{path}: format_version {version} is newer than this mr2probe reads ({FORMAT_VERSION}); "
                        "upgrade mr2probe")
    if version < 1:
        raise UserError(f"{path}: format_version {version} is invalid (must be ≥ 1); extract it again")
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
        raise UserError(f"{path}: {name}/labels must be integers (class indices), got {y.dtype}; extract it again "
                        "(or rewrite them as int64)")
    if i.dtype.kind not in "iu":
        raise UserError(f"{path}: {name}/index must be integers, got {i.dtype}; extract it again "
                        "(or rewrite it as int64)")
    return x, y, i


def _read_rows(ds: h5py.Dataset, path: Path, split: str) -> np.ndarray:
    try:
        return ds[()]
    except (OSError, RuntimeError, ValueError) as e:
        raise UserError(f"{path}: corrupt data in split {split!r} ({ds.name}: {str(e).splitlines()[0][:120]}); "
                        "the file is damaged: extract it again with --overwrite") from None


def _check_finite(ds: h5py.Dataset, path: Path, split: str, feats: np.ndarray | None = None) -> None:
    """No NaN/Inf in the features: ``feats`` if given, else ``ds`` read piece by piece (≈16 MiB, whole chunks)."""
    bad = 0
    if feats is not None:
        if not np.isfinite(feats).all():
            bad = int((~np.isfinite(feats)).any(axis=1).sum())
    else:
        n, chunk = ds.shape[0], (ds.chunks[0] if ds.chunks else 1024)
        step = chunk * max(1, (16 << 20) // max(1, chunk * ds.shape[1] * ds.dtype.itemsize))
        for lo in range(0, n, step):
            try:
                part = ds[lo:lo + step]
            except (OSError, RuntimeError, ValueError) as e:
                raise UserError(f"{path}: corrupt data in split {split!r} ({ds.name} rows {lo}..{min(n, lo + step)}: "
                                f"{str(e).splitlines()[0][:120]}); the file is damaged: extract it again with "
                                "--overwrite") from None
            bad += int((~np.isfinite(part)).any(axis=1).sum())
    if bad:
        raise UserError(f"{path}: split {split!r} has NaN or Inf features in {bad} rows; "
                        "re-extract (with --dtype float32 if float16 overflowed)")


def read_features(path: str | Path, splits: Iterable[str] | None = None, load: bool | str = True) -> FeatureSet:
    """Open, validate and (if ``load``) read a feature file.

    Checks: format and version, class_names, train and test present, each split complete, same D in every
    split, float features, integer labels in [0, K), equal lengths, and (when loaded) no NaN/Inf.
    ``load="labels"`` reads labels and index but not the features (``Split.features`` is None), which are
    scanned for NaN/Inf piece by piece instead (for files larger than memory, see ``source.py``)."""
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
        rows = {}
        for s in present:
            x, _, _ = _split_arrays(f, path, s)
            dims[s], rows[s] = x.shape[1], x.shape[0]
            if not bool(f[s].attrs.get("complete", False)):
                raise UserError(f"{path}: split {s!r} is incomplete ({int(f[s].attrs.get('rows_written', 0))}/"
                                f"{x.shape[0]} rows); rerun the same extract command to resume it")
        if len(set(dims.values())) > 1:
            raise UserError(f"{path}: feature dimension differs between splits: "
                            + ", ".join(f"{s}={d}" for s, d in dims.items()) + "; extract every split with the same "
                            "encoder (--overwrite)")
        fs = FeatureSet(path=path, attrs=attrs, class_names=names, dim=next(iter(dims.values())), rows=rows)
        if not load:
            return fs
        for s in wanted:
            x, y, i = _split_arrays(f, path, s)
            feats = _read_rows(x, path, s) if load != "labels" else None
            labels = _read_rows(y, path, s).astype(np.int64)
            index = _read_rows(i, path, s).astype(np.int64)
            _check_finite(x, path, s, feats)
            if len(labels) and (labels.min() < 0 or labels.max() >= k):
                raise UserError(f"{path}: split {s!r} has labels outside [0, {k}) "
                                f"(min {labels.min()}, max {labels.max()}); class_names lists {k} classes: "
                                "labels and class_names disagree, extract it again")
            fs.splits[s] = Split(feats, labels, index)
    return fs


def row_sources(path: str | Path, split: str) -> np.ndarray:
    """[N] str: each row's source in ``split`` of the feature file (its ``source`` dataset); "split:index" for a
    file written without one (older files, other tools)."""
    path = Path(path)
    with _open(path) as f:
        if split not in f:
            raise UserError(f"{path}: split {split!r} is missing")
        _, _, index = _split_arrays(f, path, split)
        g = f[split]
        if SOURCE not in g:
            return np.char.add(f"{split}:", _read_rows(index, path, split).astype(str))
        ds = g[SOURCE]
        if not isinstance(ds, h5py.Dataset) or ds.shape != index.shape or ds.dtype.kind not in "OSU":
            raise UserError(f"{path}: {split}/{SOURCE} must be one string per row ({index.shape[0]}), got "
                            f"{getattr(ds, 'dtype', '?')} {getattr(ds, 'shape', '?')}")
        try:
            return np.asarray(ds.asstr()[()], dtype=str)
        except (OSError, RuntimeError, ValueError) as e:
            raise UserError(f"{path}: corrupt data in {split}/{SOURCE} ({str(e).splitlines()[0][:120]})") from None


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
    """Resumable, crash-consistent writer. Rows go into preallocated chunked datasets of ``<path>.partial``;
    each split records ``rows_written`` after every flushed write, and ``complete`` when done. ``finalize()``
    renames to ``path``.

    Resuming: a partial file whose identity attrs (encoder, dataset, class_names, preprocessing, weights,
    dtype, subset, autocast) match is reopened and each split continues from ``rows_written``; otherwise it is
    a ``UserError`` unless ``overwrite``.

    Crash consistency (SIGKILL / OOM at any instant): the partial file is created complete (attrs set) under a
    temporary name and renamed; every chunk is allocated when a split begins (so later writes only overwrite
    data in place and never touch the chunk index); ``rows_written`` moves only after the rows are flushed.
    With ``checksum`` (the default) every dataset gets HDF5's fletcher32 filter, so a damaged chunk is
    detected on read; a chunk torn by a kill during its write is detected on resume, zeroed, and its rows
    recomputed (``recovered`` maps split → rows dropped that way).
    """

    IDENTITY = ("encoder", "dataset", "class_names", "preprocessing", "weights_sha256", "feature_dtype", "subset",
                "autocast", "readout")
    LEGACY_OPTIONAL = ("autocast",)  # not recorded by older versions: a partial without it is not refused
    SPLIT_DATASETS = ("features", "labels", "index")

    def __init__(self, path: str | Path, attrs: dict[str, Any], dim: int, dtype: str = "float16",
                 overwrite: bool = False, checksum: bool = True, chunk_rows: int | None = None) -> None:
        self.path = Path(path)
        self.partial = partial_path(self.path)
        self.dim, self.dtype = dim, np.dtype(dtype)
        self.checksum, self.chunk_rows = checksum, max(1, int(chunk_rows or CHUNK_ROWS))
        self.recovered: dict[str, int] = {}
        attrs = dict(attrs, feature_dtype=str(self.dtype))
        if overwrite:
            self.partial.unlink(missing_ok=True)
        self.f = self._open_partial(attrs)

    def _open_partial(self, attrs: dict[str, Any]) -> h5py.File:
        """The partial file to write into: a new one, or the one there when it was started with the same identity
        attrs (a damaged one is started over)."""
        if not self.partial.exists():
            return self._create(attrs)
        try:
            f = h5py.File(self.partial, "a")
        except OSError as e:
            return self._start_over(e, attrs)
        try:
            old = {k: _attr_str(f.attrs.get(k)) for k in self.IDENTITY}
        except (OSError, KeyError, RuntimeError) as e:
            f.close()
            return self._start_over(e, attrs)
        self._check_identity(f, old, attrs)
        return f

    def _start_over(self, error: Exception, attrs: dict[str, Any]) -> h5py.File:
        """Warn that the partial file is damaged, delete it and create a new one."""
        _warn(f"{self.partial} is damaged ({str(error).splitlines()[0][:100]}); starting that extraction over")
        self.partial.unlink()
        return self._create(attrs)

    def _check_identity(self, f: h5py.File, old: dict[str, Any], attrs: dict[str, Any]) -> None:
        """Close ``f`` and raise a UserError when its identity attrs ``old`` differ from those of ``attrs``."""
        new = {k: attrs.get(k) for k in self.IDENTITY}
        diff = [k for k in self.IDENTITY
                if old[k] != new[k] and not (k in self.LEGACY_OPTIONAL and old[k] is None)]
        if diff:
            f.close()
            detail = "; ".join(f"{k}: {_short(old[k])} there, {_short(new[k])} now" for k in diff)
            raise UserError(f"{self.partial} is an unfinished extraction with other settings ({detail}); "
                            "rerun it with its settings to resume, or pass --overwrite to start over")

    def _create(self, attrs: dict[str, Any]) -> h5py.File:
        """A new partial file with all its root attrs, made under a temporary name and renamed into place."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(f"{self.partial}.{os.getpid()}.tmp")
        with h5py.File(tmp, "w") as f:
            for k, v in attrs.items():
                if v is not None:
                    f.attrs[k] = v
        os.replace(tmp, self.partial)
        return h5py.File(self.partial, "a")

    def chunk_rows_of(self, split: str) -> int | None:
        """Rows per chunk of the split's datasets (None if not chunked)."""
        chunks = self.f[split]["features"].chunks
        return chunks[0] if chunks else None

    def rows_written(self, split: str) -> int:
        return int(self.f[split].attrs["rows_written"]) if split in self.f else 0

    def is_complete(self, split: str) -> bool:
        return split in self.f and bool(self.f[split].attrs.get("complete", False))

    def _begun(self, split: str) -> bool:
        """Whether ``split`` was fully set up by :meth:`begin` (a kill during begin leaves it half made)."""
        g = self.f.get(split)
        return (isinstance(g, h5py.Group) and "rows_written" in g.attrs and "complete" in g.attrs
                and all(isinstance(g.get(k), h5py.Dataset) for k in self.SPLIT_DATASETS))

    def begin(self, split: str, n: int, sources: Any = None) -> int:
        """Create the split's datasets for ``n`` rows (if new), with ``sources`` (n strings: each row's source,
        known before any row is encoded) as its ``source`` dataset; return the row to resume from."""
        if split in self.f and not self._begun(split):
            del self.f[split]
        if split not in self.f:
            self._create_split(split, n, sources)
            return 0
        have = self.f[split]["features"].shape
        if have[0] != n or have[1] != self.dim:
            raise UserError(f"{self.partial}: split {split!r} was started with {have[0]} rows of dim {have[1]}, "
                            f"now {n} of dim {self.dim}; pass --overwrite to start over")
        self._recover(split)
        return self.rows_written(split)

    def _create_split(self, split: str, n: int, sources: Any = None) -> None:
        """The split's group with its datasets for ``n`` rows (and ``source``, written whole, when given) and its
        resume point at row 0, flushed."""
        g = self.f.create_group(split)
        rows = min(self.chunk_rows, max(n, 1))
        for key, shape, dtype in (("features", (n, self.dim), self.dtype), ("labels", (n,), np.int64),
                                  ("index", (n,), np.int64)):
            self._create_dataset(g, key, shape, dtype, rows)
        if sources is not None:
            if len(sources) != n:
                raise ValueError(f"split {split!r}: {len(sources)} sources for {n} rows")
            g.create_dataset(SOURCE, data=np.asarray(sources, dtype=object), dtype=h5py.string_dtype())
        g.attrs["complete"] = False
        g.attrs["rows_written"] = 0
        self.f.flush()

    def _create_dataset(self, g: h5py.Group, key: str, shape: tuple[int, ...], dtype: Any, rows: int) -> None:
        """One dataset of a split: chunks of ``rows`` rows, every one allocated now, with the checksum if set."""
        if shape[0] == 0:  # nothing to chunk (HDF5 refuses chunks larger than an empty shape)
            g.create_dataset(key, shape, dtype=dtype)
            return
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)  # chunk index never changes after this
        g.create_dataset(key, shape, dtype=dtype, chunks=(rows,) + shape[1:], fillvalue=0, dcpl=dcpl,
                         fletcher32=self.checksum)

    def _recover(self, split: str) -> None:
        """After a kill: chunks at or after the resume point that fail their checksum (a write torn by the
        kill) are zeroed (written unfiltered), and the resume point moves back to the first of them."""
        g = self.f[split]
        if bool(g.attrs["complete"]):
            return
        start = resume = self.rows_written(split)
        for key in self.SPLIT_DATASETS:
            resume = min(resume, _zero_torn_chunks(g[key], start))
        if resume < start:
            g.attrs["rows_written"] = resume
            self.recovered[split] = start - resume
            _warn(f"{self.partial}: split {split!r} rows {resume}..{start} were damaged by an interrupted write; "
                  "recomputing them")
        self.f.flush()

    def read_prefix(self, split: str, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Labels and index of rows [0, stop) already written (to check a resume against the dataset)."""
        g = self.f[split]
        try:
            return g["labels"][:stop], g["index"][:stop]
        except OSError as e:
            raise UserError(f"{self.partial}: split {split!r} is damaged ({str(e).splitlines()[0][:100]}); "
                            "pass --overwrite to start over") from None

    def write(self, split: str, start: int, features: np.ndarray, labels: np.ndarray, index: np.ndarray) -> None:
        """Write rows [start, start+len) and advance the resume point (flushed before it moves). Rows are
        appended: ``start`` must be the split's current ``rows_written``."""
        self._check_rows(split, start, features, labels, index)
        g, stop = self.f[split], start + len(labels)
        if stop == start:
            return
        g["features"][start:stop] = features.astype(self.dtype, copy=False)
        g["labels"][start:stop] = labels
        g["index"][start:stop] = index
        self.f.flush()
        g.attrs["rows_written"] = stop
        self.f.flush()

    def _check_rows(self, split: str, start: int, features: np.ndarray, labels: np.ndarray,
                    index: np.ndarray) -> None:
        """Refuse rows :meth:`write` cannot take: not at the resume point, of mismatched shapes, past the split's
        end (ValueError), or not finite (UserError)."""
        g, stop = self.f[split], start + len(labels)
        if start != self.rows_written(split):
            raise ValueError(f"split {split!r}: write at row {start}, but {self.rows_written(split)} rows are written")
        if features.shape != (len(labels), self.dim) or len(index) != len(labels):
            raise ValueError(f"split {split!r}: features {features.shape}, labels {len(labels)}, index {len(index)} "
                             f"rows (dim {self.dim})")
        if stop > g["features"].shape[0]:
            raise ValueError(f"split {split!r}: rows {start}..{stop} past its {g['features'].shape[0]} rows")
        if not np.isfinite(features).all():
            raise UserError(f"encoder produced NaN/Inf features in split {split!r} rows {start}..{stop}")

    def end(self, split: str) -> None:
        g = self.f[split]
        if int(g.attrs["rows_written"]) != g["features"].shape[0]:
            raise RuntimeError(f"split {split} ended early")
        g.attrs["complete"] = True
        self.f.flush()

    def finalize(self) -> Path:
        """Close, sync and atomically rename ``.partial`` → final path."""
        self.f.close()
        _fsync(self.partial)
        os.replace(self.partial, self.path)
        try:
            _fsync(self.path.parent)  # makes the rename durable
        except OSError:
            pass
        return self.path

    def close(self) -> None:
        if self.f.id.valid:
            self.f.close()


def _zero_torn_chunks(ds: h5py.Dataset, start: int) -> int:
    """Zero (written unfiltered) the chunks of ``ds`` from the one holding row ``start`` on that fail their
    checksum; return the first row of the first of them, or ``start`` when none does (or ``ds`` has no checksum)."""
    nfilters = ds.id.get_create_plist().get_nfilters()
    if not nfilters or ds.chunks is None:
        return start  # without a checksum a torn chunk still holds the old bytes before rows_written
    resume = start
    rows, n = ds.chunks[0], ds.shape[0]
    for c0 in range(start - start % rows, n, rows):
        try:
            ds[c0:min(c0 + rows, n)]
        except OSError:
            raw = int(np.prod(ds.chunks)) * ds.dtype.itemsize
            ds.id.write_direct_chunk((c0,) + (0,) * (ds.ndim - 1), bytes(raw), (1 << nfilters) - 1)
            resume = min(resume, c0)
    return resume


def _fsync(path: Path) -> None:
    """Flush ``path`` (a file or a folder) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def _warn(message: str) -> None:
    import sys

    print(f"warning: {message}", file=sys.stderr)


def write_features(path: str | Path, attrs: dict[str, Any], splits: dict[str, Split | tuple],
                   dtype: str = "float32") -> Path:
    """Write a whole feature file at once (atomically). ``splits`` maps name → Split or (X, y, index)."""
    items = {s: v if isinstance(v, Split) else Split(*v) for s, v in splits.items()}
    dim = next(iter(items.values())).features.shape[1]
    w = FeatureWriter(path, attrs, dim, dtype, overwrite=True)
    try:
        for s, sp in items.items():
            w.begin(s, len(sp), sp.source)
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


def content_sha256(path: str | Path, block_rows: int = 65536) -> str:
    """sha256 of what a probe trains on: the number of classes and, per split, the features and labels (their
    dtypes, shapes and values). Unlike ``file_sha256`` it ignores timestamps and other provenance, so
    re-extracting identical features gives the same digest (finished training seeds are keyed by it)."""
    path = Path(path)
    h = hashlib.sha256()
    with _open(path) as f:
        _, names = _check_header(f, path)
        h.update(f"classes={len(names)}".encode())
        for s in (s for s in SPLITS if s in f):
            x, y, _ = _split_arrays(f, path, s)
            h.update(f"|{s}|{x.dtype.str}{x.shape}|{y.dtype.str}{y.shape}|".encode())
            for i in range(0, x.shape[0], block_rows):
                h.update(np.ascontiguousarray(x[i:i + block_rows]).tobytes())
            h.update(np.ascontiguousarray(y[()]).tobytes())
    return h.hexdigest()


def describe(path: str | Path) -> dict[str, Any]:
    """What ``mr2probe info`` prints: layout, per-split and per-class counts, dim, dtype, provenance."""
    fs = read_features(path, load=False)
    out: dict[str, Any] = {"path": str(fs.path), "attrs": fs.attrs, "dim": fs.dim,
                           "num_classes": fs.num_classes, "splits": {}}
    with h5py.File(fs.path, "r") as f:
        for s in SPLITS:
            if s in f:
                y = _read_rows(f[s]["labels"], fs.path, s)
                out["splits"][s] = {"rows": int(len(y)), "dtype": str(f[s]["features"].dtype),
                                    "chunks": f[s]["features"].chunks, "complete": bool(f[s].attrs["complete"]),
                                    "per_class": np.bincount(y, minlength=fs.num_classes).tolist()}
    return out
