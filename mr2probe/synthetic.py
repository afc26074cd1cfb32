"""Feature files made from a spec: a positive control for MR2, where class spreads differ by construction.

Two spec families (``materialize(spec, features_dir)`` writes the file once and returns its path):

``synthetic:K=10,D=64,n=200,spread=1:1:1:2:2:2:3:3:3:3,sep=3,seed=0``
    Seeded isotropic Gaussian class clusters. Keys (all optional; defaults K=10, D=64, n=200, spread=1, sep=3,
    seed=0, :data:`SYNTH_DEFAULTS`):
    K classes (≥ 2), D dims (≥ 1), n rows per class in each split train / val / test, ``spread`` the per-class
    standard deviation σ_k per coordinate, ``sep`` the distance of every class mean from the origin, ``seed``.
    ``spread`` is one value (every class), K values joined by ``:`` (``1:1:2:3``), or ``ramp:A-B`` (σ_k linear
    from A to B over the classes, ``np.linspace(A, B, K)``). With a seeded generator ``rng``::

        μ_k = sep · q_k,   q = rows of an orthonormal K×D matrix (QR of a Gaussian) when D ≥ K,
                            else K independent random unit vectors;
        x = μ_y + σ_y · ε,  ε ~ N(0, I_D),  y = each class n times, per split (train, val, test in that order).

    So ‖μ_j − μ_k‖ = sep·√2 (D ≥ K), the L2 statistics of the spec are ‖μ_k‖² = sep² and ŝ²_k ≈ D·σ_k², and
    MR2's variability v_k = ‖μ_k‖² + ŝ²_k grows with σ_k: classes with a larger spread are the harder ones
    (along the line between two means the overlap is Φ(−sep/(√2·σ))) and get the larger margins.
    Features are stored as float32.

``spread:PATH,classes=0:3:5,factor=2``
    A copy of the feature file PATH in which the rows (every split) of the chosen classes (indices or class
    names joined by ``:``) are moved away from their class's *train* mean by ``factor`` F > 0::

        z' = μ_k + F · (z − μ_k),   μ_k = mean of class k's train features (float64), k ∈ classes;

    computed in float64 and stored in the source's dtype. Every other row, the labels and the index are copied
    unchanged (byte for byte); F = 1 is an identical copy (the control). Class names, encoder and dataset are
    the source's.

The families are :class:`FeatureSpecFamily` entries of ``SPEC_FAMILIES``, built by name:
``SPEC_FAMILIES.create("synthetic:K=4")`` = ``SyntheticFamily.build(Options(arg="K=4"))`` → :class:`Spec`.

Each file records its provenance in the root attributes like other feature files: ``source`` (the spec, in
canonical form), ``spec`` (its parameters as JSON), ``spec_identity`` (what the file name's hash covers) and, for
``spread:``, ``source_content_sha256`` (the source file's :func:`~mr2probe.featurestore.content_sha256`). The file
name is readable and ends with a short hash of the canonical spec (of the source's content, not its path, for
``spread:``): ``<readable>-<hash10>.h5``; an existing file of that name is reused. Bad specs raise one-line
:class:`~mr2probe.errors.UserError` s.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .atomic import atomic_write
from .errors import UserError
from .featurestore import SPLITS, Split, base_attrs, content_sha256, read_features, write_features
from . import registry

SYNTH_DEFAULTS: dict[str, Any] = {"K": 10, "D": 64, "n": 200, "spread": "1", "sep": 3.0, "seed": 0}
SYNTH_SPLITS = ("train", "val", "test")
MAX_VALUES = 2 ** 29  # float32 values of a synthetic file (2 GiB): larger specs are refused
_HASH_CHARS = 10


@dataclass
class Spec:
    """A parsed spec: its canonical text, readable file stem, parameters (JSON-able) and writer."""

    canonical: str
    stem: str
    params: dict[str, Any]
    build: Callable[[Path], Path]  # writes the file at the given path and returns it
    identity: str  # what the file name's hash covers (canonical text, + the source's content for spread:)

    def file_name(self) -> str:
        digest = hashlib.sha256(self.identity.encode()).hexdigest()[:_HASH_CHARS]
        return f"{self.stem}-{digest}.h5"


class FeatureSpecFamily(registry.Spec):
    """A feature-spec family (``"synthetic:"``, ``"spread:"``): ``build(Options(arg=<text after the colon>))``
    parses the spec into a :class:`Spec` (one-line UserError when it is bad)."""

    @classmethod
    def build(cls, options: registry.Options) -> Spec:
        raise NotImplementedError(f"{cls.__name__} does not define build(options)")


SPEC_FAMILIES: registry.Registry[type[FeatureSpecFamily]] = registry.Registry("feature spec", base=FeatureSpecFamily)


def _bad(spec: str, why: str) -> UserError:
    return UserError(f"bad feature spec {spec!r}: {why}")


def _options(spec: str, text: str, known: tuple[str, ...]) -> dict[str, str]:
    """``a=1,b=2`` → {"a": "1", "b": "2"}; unknown, repeated or malformed keys are refused."""
    out: dict[str, str] = {}
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        if "=" not in item:
            raise _bad(spec, f"{item!r} is not KEY=VALUE (keys: {', '.join(known)})")
        key, value = (s.strip() for s in item.split("=", 1))
        if key not in known:
            raise _bad(spec, f"unknown key {key!r} (keys: {', '.join(known)})")
        if key in out:
            raise _bad(spec, f"key {key!r} given twice")
        out[key] = value
    return out


def _int(spec: str, key: str, value: str, low: int) -> int:
    try:
        v = int(value)
    except ValueError:
        raise _bad(spec, f"{key} must be an integer, got {value!r}") from None
    if v < low:
        raise _bad(spec, f"{key} must be ≥ {low}, got {v}")
    return v


def _float(spec: str, key: str, value: str, positive: bool = False) -> float:
    try:
        v = float(value)
    except ValueError:
        raise _bad(spec, f"{key} must be a number, got {value!r}") from None
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise _bad(spec, f"{key} must be a finite number {'> 0' if positive else '≥ 0'}, got {value!r}")
    return v


def spread_profile(spec: str, text: str, k: int) -> np.ndarray:
    """σ_k of every class from ``spread=``: one value, K values joined by ``:``, or ``ramp:A-B``."""
    text = text.strip()
    if text.startswith("ramp:"):
        m = re.fullmatch(r"ramp:([^-]+)-(.+)", text)
        if not m:
            raise _bad(spec, f"spread {text!r}: a ramp is ramp:A-B, e.g. ramp:1-3")
        lo, hi = (_float(spec, "spread", v, positive=True) for v in m.groups())
        return np.linspace(lo, hi, k)
    values = [_float(spec, "spread", v, positive=True) for v in text.split(":")]
    if len(values) == 1:
        return np.full(k, values[0])
    if len(values) != k:
        raise _bad(spec, f"spread lists {len(values)} values for K={k} classes (give one value, K values "
                         "joined by ':', or ramp:A-B)")
    return np.asarray(values, dtype=np.float64)


def _fmt(v: float) -> str:
    return f"{v:g}"


@SPEC_FAMILIES.register("synthetic:", help="synthetic:K=10,D=64,n=200,spread=1:2:3|ramp:1-3,sep=3,seed=0")
class SyntheticFamily(FeatureSpecFamily):
    """Gaussian class clusters with per-class spreads: :func:`parse_synthetic`."""

    @classmethod
    def build(cls, options: registry.Options) -> Spec:
        return parse_synthetic(options.arg)


@SPEC_FAMILIES.register("spread:", help="spread:PATH,classes=0:3:5,factor=2")
class SpreadFamily(FeatureSpecFamily):
    """A real feature file with chosen classes spread about their train means: :func:`parse_spread`."""

    @classmethod
    def build(cls, options: registry.Options) -> Spec:
        return parse_spread(options.arg)


def parse_synthetic(arg: str) -> Spec:
    """Gaussian class clusters with per-class spreads (see the module docstring)."""
    spec = f"synthetic:{arg}"
    o = {**{k: str(v) for k, v in SYNTH_DEFAULTS.items()}, **_options(spec, arg, tuple(SYNTH_DEFAULTS))}
    k, d, n = _int(spec, "K", o["K"], 2), _int(spec, "D", o["D"], 1), _int(spec, "n", o["n"], 1)
    sigma = spread_profile(spec, o["spread"], k)
    sep, seed = _float(spec, "sep", o["sep"]), _int(spec, "seed", o["seed"], 0)
    if k * n * len(SYNTH_SPLITS) * d > MAX_VALUES:
        raise _bad(spec, f"{k}·{n}·{len(SYNTH_SPLITS)}·{d} values is larger than the {MAX_VALUES} allowed")
    spread_text = _fmt(sigma[0]) if np.all(sigma == sigma[0]) else ":".join(_fmt(s) for s in sigma)
    params = {"K": k, "D": d, "n": n, "spread": [float(s) for s in sigma], "sep": sep, "seed": seed}
    canonical = f"synthetic:K={k},D={d},n={n},spread={spread_text},sep={_fmt(sep)},seed={seed}"
    short = (_fmt(sigma[0]) if np.all(sigma == sigma[0])
             else f"{_fmt(sigma.min())}-{_fmt(sigma.max())}")
    stem = f"synthetic-K{k}-D{d}-n{n}-spread{short}-sep{_fmt(sep)}-seed{seed}"
    return Spec(canonical, stem, params, lambda path: _write_synthetic(path, canonical, params), canonical)


def gaussian_clusters(k: int, d: int, n: int, sigma: np.ndarray, sep: float, seed: int
                      ) -> tuple[np.ndarray, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Class means [K, D] and {split: (X [K·n, D] float32, y [K·n])}: x = μ_y + σ_y·ε (module docstring)."""
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((d, k))
    if d >= k:
        q = np.linalg.qr(g)[0].T  # [K, D], orthonormal rows
    else:
        q = (g / np.linalg.norm(g, axis=0, keepdims=True)).T
    mu = sep * q
    y = np.repeat(np.arange(k, dtype=np.int64), n)
    out = {}
    for s in SYNTH_SPLITS:
        eps = rng.standard_normal((k * n, d))
        out[s] = ((mu[y] + sigma[y, None] * eps).astype(np.float32), y.copy())
    return mu, out


def _write_synthetic(path: Path, canonical: str, p: dict[str, Any]) -> Path:
    sigma = np.asarray(p["spread"])
    _, data = gaussian_clusters(p["K"], p["D"], p["n"], sigma, p["sep"], p["seed"])
    names = [f"c{k}-s{_fmt(s)}" for k, s in enumerate(sigma)]
    attrs = base_attrs("synthetic", "gaussian-clusters", names)
    attrs.update(source=canonical, spec=json.dumps(p, sort_keys=True), spec_identity=canonical)
    splits = {s: Split(x, y, np.arange(len(y), dtype=np.int64)) for s, (x, y) in data.items()}
    return write_features(path, attrs, splits, dtype="float32")


def parse_spread(arg: str) -> Spec:
    """A real feature file with the chosen classes spread about their train means (see the module docstring)."""
    spec = f"spread:{arg}"
    src_text, _, rest = arg.partition(",")
    if not src_text.strip():
        raise _bad(spec, "give the source feature file first: spread:PATH,classes=0:3:5,factor=2")
    o = _options(spec, rest, ("classes", "factor"))
    for key in ("classes", "factor"):
        if key not in o:
            raise _bad(spec, f"{key}= is required (spread:PATH,classes=0:3:5,factor=2)")
    factor = _float(spec, "factor", o["factor"], positive=True)
    src = Path(src_text.strip())
    fs = read_features(src, load=False)  # validates the source; missing or corrupt → its own one-line error
    classes = _classes(spec, o["classes"], fs.class_names)
    source_hash = content_sha256(src)
    cls_text = ":".join(str(c) for c in classes)
    canonical = f"spread:{src},classes={cls_text},factor={_fmt(factor)}"
    params = {"source": str(src), "classes": classes, "factor": factor}
    stem = f"{_slug(src.stem)}-spread-c{'_'.join(str(c) for c in classes)}-x{_fmt(factor)}"
    identity = f"spread:classes={cls_text},factor={_fmt(factor)},source_content_sha256={source_hash}"

    def build(path: Path) -> Path:
        return _write_spread(path, src, canonical, params, source_hash, identity)

    return Spec(canonical, stem, {**params, "source_content_sha256": source_hash}, build, identity)


def _classes(spec: str, text: str, names: list[str]) -> list[int]:
    """``0:3:5`` or class names joined by ``:`` → sorted distinct indices in [0, K)."""
    out = []
    for item in (t.strip() for t in text.split(":")):
        if re.fullmatch(r"\d+", item):
            c = int(item)
            if c >= len(names):
                raise _bad(spec, f"class {c} is out of range (the file has K={len(names)} classes, "
                                 f"0..{len(names) - 1})")
        elif item in names:
            c = names.index(item)
        else:
            raise _bad(spec, f"class {item!r} is neither an index nor a class name of the file")
        if c in out:
            raise _bad(spec, f"class {item!r} listed twice")
        out.append(c)
    if not out:
        raise _bad(spec, "classes= lists no class")
    return sorted(out)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "features"


def spread_rows(x: np.ndarray, y: np.ndarray, mu: np.ndarray, classes: list[int], factor: float) -> np.ndarray:
    """z' = μ_y + F·(z − μ_y) for rows whose label is in ``classes`` (float64, cast back to x's dtype); others as
    they are. ``mu`` [K, D] float64."""
    out = x.copy()
    rows = np.flatnonzero(np.isin(y, classes))
    z = x[rows].astype(np.float64)
    m = mu[y[rows]]
    out[rows] = (m + factor * (z - m)).astype(x.dtype)
    return out


def class_means(x: np.ndarray, y: np.ndarray, k: int) -> np.ndarray:
    """μ_k = mean of x over label k (float64, [K, D]; zero for an empty class), one scatter-add."""
    sums = np.zeros((k, x.shape[1]))
    np.add.at(sums, y, x.astype(np.float64))
    return sums / np.maximum(np.bincount(y, minlength=k), 1)[:, None]


def _write_spread(path: Path, src: Path, canonical: str, params: dict[str, Any], source_hash: str,
                  identity: str) -> Path:
    fs = read_features(src)
    dtype = str(next(iter(fs.splits.values())).features.dtype)
    if any(str(sp.features.dtype) != dtype for sp in fs.splits.values()):
        dtype = "float32"
    mu = class_means(fs.splits["train"].features, fs.splits["train"].labels, fs.num_classes)
    attrs = {k: v for k, v in fs.attrs.items() if k not in ("created_utc", "feature_dtype")}
    fresh = base_attrs(fs.encoder, fs.dataset, fs.class_names)
    attrs.update({k: fresh[k] for k in ("created_utc", "mr2probe_version", "torch_version")})
    if "source" in fs.attrs:
        attrs["derived_from_source"] = fs.attrs["source"]
    attrs.update(source=canonical, spec=json.dumps(params, sort_keys=True), source_content_sha256=source_hash,
                 spec_identity=identity)
    splits = {s: Split(spread_rows(sp.features.astype(dtype, copy=False), sp.labels, mu, params["classes"],
                                   params["factor"]), sp.labels, sp.index)
              for s, sp in fs.splits.items() if s in SPLITS}
    return write_features(path, attrs, splits, dtype=dtype)


def parse_spec(spec: str) -> Spec:
    """The :class:`Spec` of a ``synthetic:`` or ``spread:`` text (one-line UserError when it is bad)."""
    spec = spec.strip()
    if spec not in SPEC_FAMILIES:
        raise UserError(f"unknown feature spec {spec!r}; expected synthetic:K=..,D=..,n=..,spread=..,sep=..,seed=.. "
                        "or spread:PATH,classes=..,factor=..")
    return SPEC_FAMILIES.create(spec)


def materialize(spec: str, features_dir: Path) -> Path:
    """Write the feature file of ``spec`` to ``features_dir/<readable>-<hash>.h5`` unless it is there; its path.

    Written under a temporary name and renamed, so a concurrent or interrupted call never leaves a partial file
    at the final name (two concurrent calls write the same content; the last rename wins)."""
    s = parse_spec(spec)
    features_dir = Path(features_dir)
    path = features_dir / s.file_name()
    if path.exists():
        return path
    features_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(path, s.build)
    return path


def materialize_to(spec: str, out: Path, overwrite: bool = False) -> Path:
    """Write the feature file of ``spec`` at ``out`` exactly (``mr2probe synth SPEC --out PATH``); an existing
    ``out`` is kept when it holds the same spec (same canonical text and source content), else refused unless
    ``overwrite``."""
    s = parse_spec(spec)
    out = Path(out)
    if out.exists() and not overwrite:
        if _same_spec(out, s):
            return out
        raise UserError(f"{out} exists and holds other features; pass --overwrite to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, s.build)
    return out


def _same_spec(path: Path, s: Spec) -> bool:
    try:
        attrs = read_features(path, load=False).attrs
    except UserError:
        return False
    return attrs.get("spec_identity") == s.identity
