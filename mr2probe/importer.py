"""``mr2probe import``: features made by other tools → a feature file (the contract of ``features.md``).

Two sources are read:

* an ``.npz`` file (``numpy.savez``) with ``{split}_features`` [N, D] and ``{split}_labels`` [N] for split ∈ train,
  val, test (train and test required), optional ``{split}_index`` [N], ``{split}_source`` [N] (strings: each row's
  image path or id) and ``class_names`` (a string array);
* a folder of per-split ``.npy`` / ``.pt`` / ``.pth`` files, e.g. CLIP_benchmark's linear-probe cache
  (``FEATURE_ROOT/MODEL_ID/features_{train,val,test}.pt`` and ``targets_{split}.pt``). Features are named
  ``features_{split}`` or ``{split}_features``, labels ``targets_{split}``, ``labels_{split}``, ``{split}_labels``
  or ``{split}_targets``, the optional index ``index_{split}`` or ``{split}_index`` and source ``source_{split}`` or
  ``{split}_source`` (a ``.npy`` of strings); class names may lie beside them
  in ``class_names.json`` (a JSON list) or ``class_names.txt`` (one per line). ``.pt`` files are read with
  ``torch.load(weights_only=True)`` (no pickled code runs) and must hold one tensor; ``.npy`` without pickles.

In both, ``valid`` and ``validation`` name the val split; other arrays are left alone ("text_features"), except
names that look like another split ("trainval_features"), which are refused rather than silently dropped.
``class_names`` given to :func:`import_features` (the ``--class-names FILE`` flag) win; without any, classes are
named "0", "1", ... up to the largest label. The arrays are checked as the reader checks a file, each problem one
``UserError`` line naming the source: train and test present, 2-D floating features with the same D in every split,
no NaN/Inf, 1-D integer labels (one per row) in [0, K), index (if given) one integer per row. Features are stored as
float16 when every split is float16, else as float32; the index defaults to 0..N-1 and each row's source (the
file's ``source`` dataset) to ``"DATASET:split:index"`` (``--dataset``). The file is written as
``OUT.partial`` and renamed when whole (the project's own writer, :func:`mr2probe.featurestore.write_features`), so
a failed import leaves nothing at ``OUT``.
"""
from __future__ import annotations

import json
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import UserError
from .featurestore import SPLITS, Split, base_attrs, partial_path, write_features

SPLIT_ALIASES = {"train": ("train",), "val": ("val", "valid", "validation"), "test": ("test",)}
FOLDER_EXTENSIONS = (".npy", ".pt", ".pth")
CLASS_NAME_FILES = ("class_names.json", "class_names.txt")
_NAMED = re.compile(r"^(?:(features|targets|labels|index|source)_(\w+)|(\w+)_(features|targets|labels|index|source))$")
_CACHE = re.compile(r"^(?:features|targets)_(\w+?)_cache_\d+$")  # CLIP_benchmark's unfinished pieces


@dataclass
class Imported:
    """What was found in a source: arrays per split, class names (None if not given) and what kind it was."""

    splits: dict[str, Split]
    class_names: list[str] | None
    kind: str


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:160] if text else type(e).__name__


def _split_of(name: str) -> str | None:
    for ours, aliases in SPLIT_ALIASES.items():
        if name in aliases:
            return ours
    return None


def _torch_load(path: Path) -> np.ndarray:
    import pickle

    import torch

    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, OSError, EOFError, ValueError, zipfile.BadZipFile) as e:
        raise UserError(f"cannot read {path} with torch.load(weights_only=True) (a corrupt file, or one that holds "
                        f"more than tensors): {_one_line(e)}") from None
    if not isinstance(obj, torch.Tensor):
        raise UserError(f"{path} holds a {type(obj).__name__}, not one tensor; save each array on its own "
                        "(torch.save(tensor, path))")
    obj = obj.detach()
    return (obj.float() if obj.dtype == torch.bfloat16 else obj).numpy()  # numpy has no bfloat16


def _np_load(path: Path) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise UserError(f"cannot read {path} as a .npy array (saved without pickles): {_one_line(e)}") from None


def _read_names(path: Path) -> list[str]:
    """Class names from a JSON list or a text file with one name per line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read class names from {path}: {_one_line(e)}") from None
    if path.suffix.lower() == ".json":
        try:
            names = json.loads(text)
        except ValueError as e:
            raise UserError(f"{path}: not valid JSON ({_one_line(e)}); class names must be a JSON list of strings") \
                from None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise UserError(f"{path}: class names must be a JSON list of strings")
    else:
        names = [line.strip() for line in text.splitlines() if line.strip()]
    if not names:
        raise UserError(f"{path}: no class names in it")
    return names


Found = dict[str, dict[str, tuple[str, Callable[[], np.ndarray]]]]  # split -> role -> (array name, loader)


def _collect(src: Path, loaders: dict[str, Callable[[], np.ndarray]], where: Callable[[str], str],
             kind: str) -> Found:
    """Arrays by our split and role (features/labels/index) from named loaders. A name whose split part is not one
    of ours is refused when it looks like a split ("trainval_features"), else left alone ("text_features")."""
    found: Found = {}
    for name, load in loaders.items():
        m = _NAMED.match(name)
        if not m or _CACHE.match(name):
            continue
        role = m.group(1) or m.group(4)
        theirs = m.group(2) or m.group(3)
        ours = _split_of(theirs)
        if ours is None:
            if not any(word in theirs.lower() for word in ("train", "val", "test")):
                continue
            raise UserError(f"{src}: {where(name)} names split {theirs!r}; expected train, val (or valid, validation) "
                            f"or test ({kind})")
        role = "labels" if role == "targets" else role
        if role in found.get(ours, {}):
            raise UserError(f"{src}: split {ours!r} has two {role} arrays ({where(found[ours][role][0])} and "
                            f"{where(name)}); keep one")
        found.setdefault(ours, {})[role] = (name, load)
    return found


def _from_npz(src: Path) -> tuple[Found, list[str] | None, Callable[[str], str]]:
    try:
        with np.load(src, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as e:
        raise UserError(f"cannot read {src} as an .npz file (numpy.savez, no pickled objects): {_one_line(e)}") \
            from None
    names = None
    if "class_names" in arrays:
        a = arrays.pop("class_names")
        if a.dtype.kind not in "US" or a.ndim != 1 or not len(a):
            raise UserError(f"{src}: class_names must be a 1-D array of strings, got {a.dtype} {a.shape}")
        names = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in a.tolist()]
    loaders = {k: (lambda a=a: a) for k, a in arrays.items()}
    return _collect(src, loaders, lambda n: f"array {n!r}", "npz keys: {split}_features, {split}_labels"), names, \
        (lambda n: f"array {n!r}")


def _from_folder(src: Path) -> tuple[Found, list[str] | None, Callable[[str], str]]:
    files: dict[str, Path] = {}
    caches: set[str] = set()
    for p in sorted(src.iterdir()):
        if not p.is_file() or p.suffix.lower() not in FOLDER_EXTENSIONS:
            continue
        m = _CACHE.match(p.stem)
        if m:
            caches.add(_split_of(m.group(1)) or m.group(1))
            continue
        if p.stem in files:
            raise UserError(f"{src}: both {files[p.stem].name} and {p.name} are there; keep one")
        files[p.stem] = p
    loaders = {stem: (lambda p=p: _torch_load(p) if p.suffix.lower() in (".pt", ".pth") else _np_load(p))
               for stem, p in files.items()}
    found = _collect(src, loaders, lambda n: files[n].name, "files features_{split}.pt|.npy, targets_{split}.pt|.npy")
    for s in caches:
        if s in SPLITS and "features" not in found.get(s, {}):
            raise UserError(f"{src}: split {s!r} is an unfinished CLIP_benchmark cache (only *_cache_N.pt pieces); "
                            "rerun clip_benchmark to finish it, or delete the pieces")
    names = None
    for fname in CLASS_NAME_FILES:
        if (src / fname).is_file():
            names = _read_names(src / fname)
            break
    return found, names, (lambda n: files[n].name)


def _check(src: Path, found: Found, where: Callable[[str], str], layout: str) -> dict[str, Split]:
    """Load and validate every split (shape, dtype, finiteness, lengths); labels' range is checked later."""
    present = [s for s in SPLITS if s in found]
    for s in ("train", "test"):
        if s not in found:
            raise UserError(f"{src}: required split {s!r} is missing (has: {', '.join(present) or 'none'}); "
                            f"expected {layout}")
    splits: dict[str, Split] = {}
    dims: dict[str, int] = {}
    for s in present:
        parts = found[s]
        for role in ("features", "labels"):
            if role not in parts:
                other = "features" if role == "labels" else "labels"
                raise UserError(f"{src}: split {s!r} has {other} ({where(parts[other][0])}) but no {role}; "
                                f"expected {layout}")
        fname, lname = where(parts["features"][0]), where(parts["labels"][0])
        x = np.asarray(parts["features"][1]())
        if x.ndim != 2 or x.shape[1] == 0:
            raise UserError(f"{src}: {fname} must be 2-D [N, D], got shape {x.shape}")
        if x.dtype.kind != "f":
            raise UserError(f"{src}: {fname} must be floating point features, got {x.dtype}")
        if x.shape[0] == 0:
            raise UserError(f"{src}: split {s!r} is empty ({fname} has 0 rows)")
        finite = np.isfinite(x)
        if not finite.all():
            bad = int((~finite).any(axis=1).sum())
            raise UserError(f"{src}: split {s!r} has NaN or Inf features in {bad} rows ({fname}); fix them at the "
                            "source (float16 overflow? export float32)")
        del finite
        y = np.asarray(parts["labels"][1]())
        if y.ndim == 2 and y.shape[1] == 1:
            y = y[:, 0]
        if y.ndim != 1 or y.dtype.kind not in "iu":
            raise UserError(f"{src}: {lname} must be 1-D integer class indices, got {y.dtype} {y.shape}")
        if len(y) != x.shape[0]:
            raise UserError(f"{src}: split {s!r} has {x.shape[0]} feature rows ({fname}) but {len(y)} labels "
                            f"({lname})")
        if "index" in parts:
            iname = where(parts["index"][0])
            index = np.asarray(parts["index"][1]())
            if index.ndim != 1 or index.dtype.kind not in "iu" or len(index) != len(y):
                raise UserError(f"{src}: {iname} must be 1-D integers, one per row ({len(y)}), got {index.dtype} "
                                f"{index.shape}")
        else:
            index = np.arange(len(y), dtype=np.int64)
        dims[s] = x.shape[1]
        splits[s] = Split(x, y.astype(np.int64), index.astype(np.int64), _sources(src, parts, where, len(y)))
    if len(set(dims.values())) > 1:
        raise UserError(f"{src}: feature dimension differs between splits: "
                        + ", ".join(f"{s}={d}" for s, d in dims.items()) + "; export every split with the same "
                        "encoder")
    return splits


def _sources(src: Path, parts: dict[str, tuple[str, Callable[[], np.ndarray]]], where: Callable[[str], str],
             n: int) -> np.ndarray | None:
    """The split's ``source`` array (one string per row), None when it has none."""
    if "source" not in parts:
        return None
    a = np.asarray(parts["source"][1]())
    if a.ndim != 1 or a.dtype.kind not in "US" or len(a) != n:
        raise UserError(f"{src}: {where(parts['source'][0])} must be 1-D strings, one per row ({n}), got {a.dtype} "
                        f"{a.shape}")
    return np.char.decode(a, "utf-8", "replace") if a.dtype.kind == "S" else a


def read_source(src: str | Path, class_names: list[str] | None = None) -> Imported:
    """Read and validate an ``.npz`` or a folder of per-split ``.npy``/``.pt`` arrays (see the module doc)."""
    src = Path(src)
    if not src.exists():
        raise UserError(f"{src} not found; pass an .npz file or a folder of features_{{split}}/targets_{{split}} "
                        ".pt/.npy files")
    if src.is_dir():
        found, names, where = _from_folder(src)
        kind = "folder of per-split .npy/.pt arrays"
        layout = f"{src}/features_{{train,val,test}}.pt|.npy and targets_{{train,val,test}}.pt|.npy"
    elif src.suffix.lower() == ".npz":
        found, names, where = _from_npz(src)
        kind = "npz"
        layout = "arrays {train,val,test}_features and {train,val,test}_labels in the .npz"
    else:
        raise UserError(f"{src}: not an .npz file or a folder; mr2probe import reads numpy.savez files (.npz) and "
                        "folders of per-split .npy/.pt arrays")
    splits = _check(src, found, where, layout)
    names = class_names if class_names is not None else names
    k = len(names) if names is not None else max(int(sp.labels.max()) for sp in splits.values()) + 1
    for s, sp in splits.items():
        lo, hi = int(sp.labels.min()), int(sp.labels.max())
        if lo < 0 or hi >= k:
            why = (f"the class names list {k} classes: labels and class names disagree" if names is not None
                   else "labels must be class indices 0..K-1")
            raise UserError(f"{src}: split {s!r} has labels outside [0, {k}) (min {lo}, max {hi}); {why}")
    empty = np.flatnonzero(np.bincount(splits["train"].labels, minlength=k) == 0)
    if len(empty):
        shown = ", ".join(str(c) if names is None else f"{c} ({names[c]})" for c in empty[:5])
        more = f" and {len(empty) - 5} more" if len(empty) > 5 else ""
        raise UserError(f"{src}: class{'es' * (len(empty) > 1)} {shown}{more} of the {k} classes have no train rows; "
                        "a probe cannot learn a class it never sees (drop it and relabel 0..K-1, or add its rows)")
    return Imported(splits=splits, class_names=names, kind=kind)


def import_features(src: str | Path, out: str | Path, encoder: str = "imported", dataset: str = "imported",
                    class_names: list[str] | str | Path | None = None, overwrite: bool = False) -> Path:
    """Validate ``src`` and write it as the feature file ``out`` (atomically); returns ``out``.

    ``class_names``: a list, or a ``.json`` / ``.txt`` file of them; they win over names found in ``src``."""
    src, out = Path(src), Path(out)
    if out.exists() and not overwrite:
        raise UserError(f"{out} already exists; pass --overwrite to replace it, or choose another --out")
    if out.is_dir():
        raise UserError(f"{out} is a folder; --out names the .h5 file to write")
    if partial_path(out).exists() and not overwrite:
        raise UserError(f"{partial_path(out)} exists (an unfinished extraction or import); pass --overwrite to "
                        "replace it, or choose another --out")
    if isinstance(class_names, (str, Path)):
        class_names = _read_names(Path(class_names))
    data = read_source(src, class_names)
    k = int(max(sp.labels.max() for sp in data.splits.values())) + 1
    names = data.class_names if data.class_names is not None else [str(i) for i in range(k)]
    dtype = "float16" if all(sp.features.dtype == np.float16 for sp in data.splits.values()) else "float32"
    attrs = base_attrs(encoder, dataset, names)
    attrs["source"] = f"{src} (imported: {data.kind})"
    for s, sp in data.splits.items():
        if sp.source is None:
            sp.source = np.char.add(f"{dataset}:{s}:", sp.index.astype(str))
    try:
        return write_features(out, attrs, data.splits, dtype=dtype)
    except OSError as e:
        raise UserError(f"cannot write {out}: {e.strerror or _one_line(e)}") from None


__all__ = ["Imported", "import_features", "read_source"]
