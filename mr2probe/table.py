"""Results as pandas tables, for notebooks: ``mr2probe.load_results(RUN_DIR | [RUN_DIR, ...])`` gives one row per
(run, method, seed, class) with accuracies in points of % (as every table shows them) and
``mr2probe.summarize(RUN_DIR | [...])`` one row per (run, method) with the protocol's columns — both read from the
same :class:`~mr2probe.summary.Summary` the report renders, so a notebook and the committed tables cannot disagree::

    import mr2probe
    runs = ["results/mnist-dinov2s14-500-settings/linear-longtail100",
            "results/mnist-dinov2s14-500-settings/cosine-longtail100"]
    df = mr2probe.load_results(runs)
    hard = df[df.group == "hard"].groupby(["head", "method"]).test_acc.mean().unstack("head")
    s = mr2probe.summarize(runs)
    s.pivot(index="method", columns="head", values="ΔHard").plot.barh()
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from .results import RunResults
from .report import load_predictions, load_results as load_results_json, run_labels
from .summary import Summary, cross_run, summarize as summarize_run


def _dirs(run_dirs: str | Path | Iterable[str | Path]) -> list[Path]:
    return [Path(run_dirs)] if isinstance(run_dirs, (str, Path)) else [Path(d) for d in run_dirs]


def _setting(results: RunResults) -> dict[str, object]:
    prov = results.provenance
    return {"dataset": prov.get("dataset"), "encoder": prov.get("encoder"), "head": results.head,
            "adapter": results.adapter, "profile": results.profile["text"]}


def _summaries(run_dirs: str | Path | Iterable[str | Path], group_on: str, null: bool
               ) -> list[tuple[str, RunResults, Summary]]:
    dirs = _dirs(run_dirs)
    out = []
    for label, d in zip(run_labels(dirs), dirs):
        results = load_results_json(d)
        out.append((label, results, summarize_run(results, load_predictions(d), group_on, null)))
    return out


def load_results(run_dirs: str | Path | Iterable[str | Path], group_on: str = "val", null: bool = True
                 ) -> pd.DataFrame:
    """Long form: one row per (run, method, seed, class) with the run's setting, the hyperparameters chosen (JSON),
    the class name, its group (hard / medium / easy, ranked as ``group_on``) and its test and val accuracy
    (``test_acc``, ``val_acc``) in points of %, as in every table and summarize()."""
    rows = []
    for label, results, s in _summaries(run_dirs, group_on, null):
        group = np.empty(len(s.class_names), dtype=object)
        for name in ("hard", "medium", "easy"):
            group[getattr(s.groups, name)] = name
        for run in results.runs:
            if run.method not in s.methods:
                continue
            val = np.asarray(run.val_per_class_acc or [np.nan] * len(s.class_names), dtype=float)
            for k, name in enumerate(s.class_names):
                rows.append({"run": label, **_setting(results), "groups_on": group_on, "method": run.method,
                             "seed": run.seed, "episode": run.episode,
                             "hparams": json.dumps(run.hparams, sort_keys=True), "class": k,
                             "class_name": name, "group": group[k], "test_acc": 100 * run.per_class_acc[k],
                             "val_acc": 100 * val[k]})
    return pd.DataFrame(rows)


def summarize(run_dirs: str | Path | Iterable[str | Path], group_on: str = "val", null: bool = True) -> pd.DataFrame:
    """One row per (run, method): :func:`~mr2probe.summary.cross_run` (the frame behind every table and
    summary.csv: the protocol's columns as means over seeds in %, ``<col>_sd``, ``seeds``, CI bounds
    ``<col>_ci_lo`` / ``_hi``, Sig↑ / Sig↓) with the run's head, adapter and training profile, and booleans
    ``is_reference`` and ``null_control``."""
    items = _summaries(run_dirs, group_on, null)
    df = cross_run([(label, s) for label, _, s in items])
    setting = pd.DataFrame([{"run": label, **_setting(results)} for label, results, _ in items])
    df = df.merge(setting[["run", "head", "adapter", "profile"]], on="run", how="left")
    nulls = {label: s.null for label, _, s in items}
    df.insert(6, "is_reference", df["method"] == df["reference"])
    df.insert(7, "null_control", df["method"] == df["run"].map(nulls))
    return df
