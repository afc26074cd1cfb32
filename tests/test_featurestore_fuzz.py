"""Property-based tests (hypothesis) of the feature-file reader, one of the two places untrusted input enters (the
other, the ``train`` command line: test_cli_train_fuzz.py).

A file with random shapes (0 rows, D=1, …), dtypes, attributes and labels either reads back as a
valid FeatureSet equal to what was written, or raises a one-line UserError — exactly when the file breaks
the layout of features.md (an independent oracle below decides which) — and never another exception.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mr2probe.errors import UserError
from mr2probe.featurestore import read_features

MISSING = object()  # an attribute or dataset left out of the file
# FUZZ_EXAMPLES=2000 FUZZ_RANDOM=1 pytest tests/test_featurestore_fuzz.py: a longer hunt with fresh random examples
SETTINGS = dict(max_examples=int(os.environ.get("FUZZ_EXAMPLES", 40)), deadline=None, print_blob=True,
                derandomize=not os.environ.get("FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ---- the feature-file reader ----------------------------------------------------------------------------------

@dataclass
class SplitSpec:
    features: np.ndarray
    labels: np.ndarray
    index: np.ndarray
    complete: Any = True
    chunked: bool = False
    drop: str | None = None  # a dataset left out
    as_dataset: bool = False  # the split is a dataset, not a group


@dataclass
class FileSpec:
    attrs: dict[str, Any]
    splits: dict[str, SplitSpec] = field(default_factory=dict)
    load: bool | str = True


GOOD_FORMATS = ["mr2probe.features", np.bytes_(b"mr2probe.features")]
BAD_FORMATS = [MISSING, "other", "", np.bytes_(b"\xff\xfe"), 1, np.array(["a", "b"], dtype=h5py.string_dtype())]
GOOD_VERSIONS = [1, np.int8(1), np.uint64(1)]
BAD_VERSIONS = [MISSING, 2, 0, -1, "1", 1.5, True, np.array([1, 1])]
NAME = st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), max_size=6)


def pick(draw, good: list, bad: list, fuzz: bool) -> Any:
    """A good value, or in fuzz mode sometimes (about 1 in 3) a bad one."""
    if fuzz and draw(st.integers(0, 2)) == 0:
        return draw(st.sampled_from(bad))
    return draw(st.sampled_from(good))


@st.composite
def class_names(draw, fuzz: bool) -> tuple[Any, int]:
    """(the attribute as stored, K the reader should see)."""
    names = draw(st.lists(NAME, min_size=1, max_size=5))
    kind = pick(draw, ["ok", "bytes"], ["missing", "not json", "not list", "empty", "ints", "bad utf8", "array"],
                fuzz)
    return {"ok": (json.dumps(names), len(names)), "missing": (MISSING, 1), "not json": ("a, b", 1),
            "not list": (json.dumps({"a": 1}), 1), "empty": ("[]", 1), "ints": (json.dumps([1, 2]), 2),
            "bytes": (np.bytes_(json.dumps(names).encode()), len(names)), "bad utf8": (np.bytes_(b"[\xff]"), 1),
            "array": (np.array(names, dtype=h5py.string_dtype()), len(names))}[kind]


@st.composite
def splits(draw, k: int, fuzz: bool) -> dict[str, SplitSpec]:
    dim = draw(st.integers(1, 4))
    present = pick(draw, [("train", "test"), ("train", "val", "test"), ("test", "train")],
                   [("train",), ("test",), ("train", "val"), ()], fuzz)
    out = {}
    for s in present:
        n = draw(st.integers(0, 9))
        d = pick(draw, [dim], [1, 2, 5], fuzz)  # sometimes another D
        fdt = pick(draw, ["float32", "float16", "float64"], ["int32", "bool", "int8"], fuzz)
        finite = st.floats(-6e4, 6e4, width=16) | st.floats(width=32, allow_nan=False, allow_infinity=False)
        elements = finite | st.sampled_from([np.nan, np.inf, -np.inf, 1e300]) if fuzz else finite
        x = draw(hnp.arrays(np.float64, (n, d), elements=elements))
        with np.errstate(all="ignore"):
            x = x.astype(fdt)
        if not fuzz and not np.isfinite(x).all():  # float32 values beyond float16
            x = np.nan_to_num(x, posinf=1.0, neginf=-1.0)
        ldt = pick(draw, ["int64", "int32", "uint8", "int8", "uint64"], ["float32", "bool"], fuzz)
        lo = 0 if np.dtype(ldt).kind in "ub" or not fuzz else -2
        hi = k - 1 if not fuzz or draw(st.booleans()) else k + 2
        y = np.array(draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n)), dtype=np.int64).astype(ldt)
        if fuzz and draw(st.integers(0, 9)) == 0:
            y = np.append(y, y[:1] if n else np.zeros(1, y.dtype))  # one label too many
        idt = pick(draw, ["int64", "int32", "uint32"], ["float64"], fuzz)
        index = draw(hnp.arrays(np.int64, n, elements=st.integers(0, 10 ** 6))).astype(idt)
        complete = pick(draw, [True, np.bool_(True), 1], [False, MISSING, 0], fuzz)
        drop = pick(draw, [None], [None, None, "features", "labels", "index"], fuzz)
        as_dataset = fuzz and draw(st.integers(0, 19)) == 0
        out[s] = SplitSpec(x, y, index, complete, chunked=n > 0 and draw(st.booleans()), drop=drop,
                           as_dataset=as_dataset)
    return out


@st.composite
def feature_files(draw) -> FileSpec:
    """Valid files (half the examples) and files with random faults."""
    fuzz = draw(st.booleans())
    names, k = draw(class_names(fuzz))
    attrs = {"format": pick(draw, GOOD_FORMATS, BAD_FORMATS, fuzz),
             "format_version": pick(draw, GOOD_VERSIONS, BAD_VERSIONS, fuzz), "class_names": names,
             "encoder": "fuzz", "dataset": "fuzz", "extra": draw(st.sampled_from([MISSING, "x", 3]))}
    return FileSpec(attrs, draw(splits(k, fuzz)), load=draw(st.sampled_from([True, True, "labels"])))


def write_spec(path: Path, spec: FileSpec) -> None:
    with h5py.File(path, "w") as f:
        for key, v in spec.attrs.items():
            if v is not MISSING:
                f.attrs[key] = v
        for s, sp in spec.splits.items():
            if sp.as_dataset:
                f.create_dataset(s, data=sp.labels)
                continue
            g = f.create_group(s)
            for key, a in (("features", sp.features), ("labels", sp.labels), ("index", sp.index)):
                if key != sp.drop:
                    kw = dict(chunks=(min(4, len(a)),) + a.shape[1:], fletcher32=True) if sp.chunked and len(a) \
                        else {}
                    g.create_dataset(key, data=a, **kw)
            if sp.complete is not MISSING:
                g.attrs["complete"] = sp.complete


def expected_valid(spec: FileSpec) -> bool:
    """The oracle: whether the file follows features.md (written from the spec, not from the reader)."""
    a = spec.attrs
    fmt = a["format"]
    if isinstance(fmt, bytes):
        fmt = fmt.decode("utf-8", "replace")
    if not (isinstance(fmt, str) and fmt == "mr2probe.features"):
        return False
    v = a["format_version"]
    if not (isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and v == 1):
        return False
    names = a["class_names"]
    try:
        names = json.loads(names.decode() if isinstance(names, bytes) else names)
    except (TypeError, ValueError):
        return False
    if not (isinstance(names, list) and names and all(isinstance(n, str) for n in names)):
        return False
    k = len(names)
    if not {"train", "test"} <= set(spec.splits):
        return False
    dims = set()
    for sp in spec.splits.values():
        if sp.as_dataset or sp.drop or not bool(sp.complete):
            return False
        x, y, i = sp.features, sp.labels, sp.index
        if x.dtype.kind != "f" or y.dtype.kind not in "iu" or i.dtype.kind not in "iu":
            return False
        if len(y) != len(x) or len(i) != len(x):
            return False
        if not np.isfinite(x).all():
            return False
        if len(y) and not (y.astype(np.int64).min() >= 0 and y.astype(np.int64).max() < k):
            return False
        dims.add(x.shape[1])
    return len(dims) == 1


@settings(**SETTINGS)
@given(spec=feature_files())
def test_reader_valid_or_one_line_user_error(spec: FileSpec) -> None:
    d = Path(tempfile.mkdtemp(prefix="mr2fuzz-"))
    try:
        path = d / "f.h5"
        write_spec(path, spec)
        valid = expected_valid(spec)
        event("valid file" if valid else "invalid file")
        try:
            fs = read_features(path, load=spec.load)
        except UserError as e:
            msg = str(e)
            assert msg and "\n" not in msg, repr(msg)
            assert not valid, f"valid file refused: {msg}"
            return
        assert valid, "invalid file accepted"
        names = spec.attrs["class_names"]
        assert fs.class_names == json.loads(names.decode() if isinstance(names, bytes) else names)
        assert set(fs.splits) == set(spec.splits) and fs.dim == next(iter(spec.splits.values())).features.shape[1]
        for s, sp in spec.splits.items():
            got = fs.splits[s]
            assert fs.rows[s] == len(sp.features)
            if spec.load == "labels":
                assert got.features is None
            else:
                assert got.features.dtype == sp.features.dtype and np.array_equal(got.features, sp.features)
            assert got.labels.dtype == np.int64 and np.array_equal(got.labels, sp.labels.astype(np.int64))
            assert np.array_equal(got.index, sp.index)
            assert len(got.labels) == 0 or 0 <= got.labels.min() <= got.labels.max() < fs.num_classes
    finally:
        shutil.rmtree(d, ignore_errors=True)
