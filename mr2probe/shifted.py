"""Shifted test sets: ``mr2probe report RUN --test-features EXTRA.h5 [--class-map MAP.csv]``.

The run's selected heads (``heads.safetensors``, :func:`~mr2probe.predict.apply_heads`) are applied to the test
split of another feature file (``split="all"``: every row of it) with the same input width D. Its classes are
mapped to the run's by name, or by a class map: a CSV with a header and two columns, the other file's class name
then the run's (``their_class,our_class``); a class of the other file that the map does not name (or, by name,
that the run does not have) is left out with its images. Every head is scored on the mapped images:

    acc_k = #(pred = k and true k) / #(true k)          (the run's classes; NaN for a class with no image)
    All   = mean over images of [pred = y],   Hard = mean_{k ∈ H, n_k > 0} acc_k,   Worst = min_{n_k > 0} acc_k

H the run's hard set (the groups of its table, :func:`~mr2probe.summary.summarize`); per method the mean and
sample SD over seeds. The hard set's overlap between the run's test set and the shifted one: Jaccard
|A ∩ B| / |A ∪ B| of A = the |H| classes where the reference's mean accuracy on the run's test set is lowest and
B = the same on the shifted set, both among the classes the shifted set has (ties by class index).

Files, beside the run's tables: ``shifted-STEM.md`` (the table and the overlap), ``shifted-STEM.csv`` (numbers,
ASCII names: ``all``, ``hard``, ``worst``, ``*_sd``, ``seeds``, ``images``) and ``shifted-STEM-per_class.csv``
(long: method, seed, class, class_name, images, accuracy), STEM the other file's name without suffix.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .atomic import atomic_text
from .errors import UserError
from .featurestore import read_features
from .metrics import per_class_accuracy
from .predict import apply_heads, load_run_heads
from .report import load_predictions, load_results, markdown_table, to_csv_numbers
from .summary import sample_sd, summarize

TABLE_COLUMNS = ["All", "Hard", "Worst"]


@dataclass
class Shifted:
    """A run's heads scored on a shifted test set: the table (one row per method), per-class accuracy (long), the
    hard sets compared and their Jaccard, how many images were scored and left out."""

    table: pd.DataFrame
    per_class: pd.DataFrame
    hard_main: list[str]
    hard_shifted: list[str]
    jaccard: float
    images: int
    dropped: int
    source: Path
    unscored: list[str]  # the run's methods without a saved head (the exact probes)


def class_map(theirs: list[str], ours: list[str], path: Path | None) -> np.ndarray:
    """For each class of the other file, the run's class index (−1: left out). ``path`` None: by name; else the
    CSV's (their class, our class) rows. A CSV that cannot be read, has not two columns, names a class neither
    file has, or maps a class twice is a UserError; so is a mapping that keeps no class."""
    ours_ix = {n: i for i, n in enumerate(ours)}
    if path is None:
        out = np.array([ours_ix.get(n, -1) for n in theirs])
        if (out < 0).all():
            raise UserError("the shifted test set shares no class name with the run: pass --class-map MAP.csv")
        return out
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
    except (OSError, ValueError, pd.errors.ParserError) as e:
        raise UserError(f"--class-map {path}: not a readable CSV ({type(e).__name__})") from None
    if df.shape[1] != 2 or df.empty:
        raise UserError(f"--class-map {path}: needs a header and rows of two columns (their class, our class), "
                        f"got {df.shape[1]} column(s) and {len(df)} row(s)")
    src, dst = (df.iloc[:, i].str.strip() for i in (0, 1))
    for names, have, what in ((src, set(theirs), "the shifted file"), (dst, set(ours), "the run")):
        bad = sorted(set(names) - have)
        if bad:
            raise UserError(f"--class-map {path}: {', '.join(map(repr, bad[:3]))} not a class of {what}")
    if src.duplicated().any():
        raise UserError(f"--class-map {path}: {src[src.duplicated()].iloc[0]!r} is mapped twice")
    lookup = dict(zip(src, dst))
    return np.array([ours_ix[lookup[n]] if n in lookup else -1 for n in theirs])


def check_shifted(features: str | Path, run_features: str | Path, map_path: Path | None = None) -> None:
    """Refuse (UserError) a shifted feature file or class map that :func:`score_shifted` would refuse for a run
    trained on ``run_features``, before training: unreadable file, another D, a bad map."""
    fs, ours = read_features(features, load=False), read_features(run_features, load=False)
    if fs.dim != ours.dim:
        raise UserError(f"{features}: D = {fs.dim}, but {run_features} has D = {ours.dim}")
    class_map(fs.class_names, ours.class_names, map_path)


def _rows(fs, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(features, labels) of ``split`` of a feature set, or of every split with ``split="all"``."""
    if split == "all":
        parts = list(fs.splits.values())
        return np.concatenate([p.features for p in parts]), np.concatenate([p.labels for p in parts])
    if split not in fs.splits:
        raise UserError(f"{fs.path} has no split {split!r} (it has {', '.join(fs.splits)})")
    return fs.splits[split].features, fs.splits[split].labels


def bottom(acc: np.ndarray, present: np.ndarray, h: int) -> np.ndarray:
    """The ``h`` classes with the lowest ``acc`` among ``present`` (ties by class index), sorted."""
    idx = np.flatnonzero(present)
    return np.sort(idx[np.lexsort((idx, acc[idx]))][:h])


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """|A ∩ B| / |A ∪ B| (NaN for two empty sets)."""
    union = len(np.union1d(a, b))
    return len(np.intersect1d(a, b)) / union if union else float("nan")


def score_shifted(run_dir: str | Path, features: str | Path, map_path: Path | None = None, split: str = "test",
                  group_on: str = "val", device: str | None = None) -> Shifted:
    """The run's heads on the shifted set (see the module's docstring); nothing is written."""
    results = load_results(run_dir)
    s = summarize(results, load_predictions(run_dir), group_on)
    meta, heads = load_run_heads(run_dir)
    fs = read_features(features, load=True)
    if fs.dim != int(meta["in_dim"]):
        raise UserError(f"{features}: D = {fs.dim}, but the run's heads were trained on D = {meta['in_dim']}")
    ours = list(results.class_names)
    mapping = class_map(fs.class_names, ours, map_path)
    x, y_theirs = _rows(fs, split)
    y = mapping[y_theirs]
    keep = y >= 0
    if not keep.any():
        raise UserError(f"{features}: no image of a mapped class in {split!r}")
    preds, y = apply_heads(meta, heads, x[keep], device), y[keep]
    k, counts = len(ours), np.bincount(y, minlength=len(ours))
    hard = np.asarray(s.groups.hard)
    rows, per_class = [], []
    for key, pred in preds.items():
        method, seed = key.rsplit("/", 1)
        acc = per_class_accuracy(pred, y, k)
        rows.append({"method": method, "seed": int(seed), "All": 100 * float(np.mean(pred == y)),
                     "Hard": 100 * float(np.nanmean(acc[hard])) if (counts[hard] > 0).any() else np.nan,
                     "Worst": 100 * float(np.nanmin(acc))})
        per_class.append(pd.DataFrame({"method": method, "seed": int(seed), "class": np.arange(k),
                                       "class_name": ours, "images": counts, "accuracy": 100 * acc}))
    runs = pd.DataFrame(rows)
    table = _by_method(runs, [m for m in s.methods if m in set(runs.method)], len(y))
    ref_keys = [k_ for k_ in preds if k_.rsplit("/", 1)[0] == s.reference]
    present = counts > 0
    main = np.mean(s.acc[s.reference], axis=0) if s.reference in s.acc else np.zeros(k)  # NaN: no test image
    a = bottom(main, present, len(hard))
    b = bottom(np.mean([per_class_accuracy(preds[r], y, k) for r in ref_keys], axis=0), present, len(hard)) \
        if ref_keys else np.array([], dtype=int)
    return Shifted(table, pd.concat(per_class, ignore_index=True), [ours[i] for i in a], [ours[i] for i in b],
                   jaccard(a, b), int(keep.sum()), int((~keep).sum()), Path(features),
                   [m for m in s.methods if m not in table.index])


def _by_method(runs: pd.DataFrame, order: list[str], images: int) -> pd.DataFrame:
    """Per method (``order``): mean and sample SD (ddof = 1) over seeds of All, Hard, Worst; seeds; images."""
    g = runs.groupby("method")[TABLE_COLUMNS]
    sd = g.agg(lambda v: sample_sd(v.to_numpy(dtype=float))).add_suffix("_sd")
    out = g.mean().join(sd).join(runs.groupby("method").size().rename("seeds")).reindex(order)
    out.index.name = "method"
    return out.assign(images=images)


def shifted_markdown(r: Shifted, run_name: str) -> str:
    """The table (mean ± SD, %) and the hard sets' overlap as markdown."""
    text = pd.DataFrame({c: [f"{m:.2f}" + (f" ± {sd:.2f}" if np.isfinite(sd) else "")
                             for m, sd in zip(r.table[c], r.table[f"{c}_sd"])] for c in TABLE_COLUMNS},
                        index=r.table.index)
    return "\n".join([
        f"# {run_name} on the shifted test set {r.source.name}", "",
        f"{r.images} images scored ({r.dropped} of unmapped classes left out); % of the shifted images, mean ± "
        "sample SD over seeds; Hard: the run's hard set", "",
        markdown_table(text, text.map(lambda _: False)), "",
        f"Hard set on the run's test set: {', '.join(r.hard_main)}; on the shifted set: {', '.join(r.hard_shifted)}; "
        f"Jaccard {r.jaccard:.2f}", ""]
        + ([f"Not scored (no saved head: the exact probes are not kept): {', '.join(r.unscored)}", ""]
           if r.unscored else []))


def shifted_report(run_dir: str | Path, features: str | Path, map_path: Path | None = None, split: str = "test",
                   group_on: str = "val") -> tuple[Shifted, str]:
    """Score the shifted set (:func:`score_shifted`) and write ``shifted-STEM.md``, ``.csv`` and
    ``-per_class.csv`` into the run folder; returns the result and the text to print."""
    run_dir = Path(run_dir)
    r = score_shifted(run_dir, features, map_path, split, group_on)
    stem = f"shifted-{Path(features).stem}"
    md = shifted_markdown(r, run_dir.name)
    atomic_text(run_dir / f"{stem}.md", md)
    atomic_text(run_dir / f"{stem}.csv", to_csv_numbers(r.table.reset_index()))
    atomic_text(run_dir / f"{stem}-per_class.csv", to_csv_numbers(r.per_class))
    return r, md + f"wrote {run_dir}/{{{stem}.md,{stem}.csv,{stem}-per_class.csv}}"
