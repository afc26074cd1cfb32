"""Experiment trackers: the ``log`` setting (``--log SPEC``, a suite's ``[train] log = "SPEC"``) sends a run to
TensorBoard, MLflow or Weights & Biases, each an optional extra whose library is imported only when asked for.

SPEC is ``SCHEME[:TARGET]`` (:func:`parse_spec`):

* ``tensorboard:DIR`` — event files in ``DIR/RUN`` (``DIR/SUITE/RUN`` under ``bench``), read by ``tensorboard
  --logdir DIR``; extra ``tensorboard``;
* ``mlflow[:URI]`` — a run in the tracking store URI (a server ``http://…``, a database, ``file:PATH``), else
  MLflow's default (``MLFLOW_TRACKING_URI``); experiment ``mr2probe`` (the suite's name under ``bench``); extra
  ``mlflow``;
* ``wandb[:[ENTITY/]PROJECT]`` — a W&B run in PROJECT (default ``mr2probe``; ``WANDB_MODE=offline`` keeps it on
  disk for ``wandb sync``), grouped by suite under ``bench``; extra ``wandb``.

What a run logs (:class:`Tracking`): its settings (results.json's ``config``, the features and the profile); at the
end of every epoch of each seed stack each method's best val score over its grid points (``select``: acc or macc, in
%) as ``val_<select>/<method>/seed<S>`` at step = epochs done; at the end the final table (method × All, Hard, Worst,
ΔHard, …, verdict) as a table, its numbers as scalars ``final/<method>/<column>`` and the run folder's table.md,
table.csv and summary.json as files. Under torchrun only rank 0 logs (the seed stacks it trains, and the table).
"""
from __future__ import annotations

import contextlib
import importlib
import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import pandas as pd

from .distributed import rank_world
from .errors import UserError
from .registry import Registry
from .runconfig import ExperimentConfig
from .runstore import config_record
from .summary import Summary

FINAL_FILES = ("table.md", "table.csv", "summary.json")  # the run folder's files a tracker keeps
DEFAULT_NAME = "mr2probe"  # MLflow experiment and W&B project without one given


@dataclass(frozen=True)
class TrackerSpec:
    """A parsed ``--log`` value: the tracker's ``scheme`` and its ``target`` (folder, URI or project; "" = the
    tracker's default)."""

    scheme: str
    target: str = ""


class Tracker:
    """One tracker run, opened as ``cls(lib, target, name, group)`` (``lib``: its library, :func:`require`).
    ``module``: the library imported on open; ``extra``: the pip extra that installs it."""

    module = ""
    extra = ""
    needs_target = ""  # what the target is, when the scheme requires one

    def params(self, params: dict[str, Any]) -> None:
        """The run's settings (nested: dict values are sections)."""

    def scalars(self, values: dict[str, float], step: int) -> None:
        """Scalars at ``step`` (epochs done)."""

    def final_scalars(self, values: dict[str, float]) -> None:
        """The run's final numbers (at step 0 unless the tracker has a place for them)."""
        self.scalars(values, 0)

    def table(self, name: str, df: pd.DataFrame) -> None:
        """A table (one row per method)."""

    def files(self, paths: list[Path]) -> None:
        """Files kept with the run."""

    def close(self, failed: bool) -> None:
        """End the run (as failed when training or reporting raised)."""


TRACKERS: Registry[type[Tracker]] = Registry("tracker", base=Tracker)


def parse_spec(text: str) -> TrackerSpec | None:
    """``SCHEME[:TARGET]`` → :class:`TrackerSpec`; "" → None (no tracker); a one-line :class:`UserError` for an
    unknown scheme or a missing target."""
    text = (text or "").strip()
    if not text:
        return None
    scheme, _, target = text.partition(":")
    try:
        cls = TRACKERS.get(scheme.strip().lower())
    except UserError as e:
        raise UserError(f"--log {text!r}: {e} (SPEC: tensorboard:DIR, mlflow[:URI] or wandb[:PROJECT])") from None
    if cls.needs_target and not target.strip():
        raise UserError(f"--log {text!r}: {scheme} needs {cls.needs_target} ({scheme}:{cls.needs_target.upper()})")
    return TrackerSpec(scheme.strip().lower(), target.strip())


def require(spec: TrackerSpec) -> ModuleType:
    """The tracker's library, imported; a one-line :class:`UserError` naming the extra when it is not installed."""
    cls = TRACKERS.get(spec.scheme)
    try:
        return importlib.import_module(cls.module)
    except ImportError:
        raise UserError(f"--log {spec.scheme} needs {cls.module.split('.')[0]}, which is not installed: "
                        f"pip install 'mr2probe[{cls.extra}]'") from None


def check_spec(text: str) -> None:
    """``text`` a valid spec whose library is installed (:func:`parse_spec`, :func:`require`), before a run."""
    spec = parse_spec(text)
    if spec is not None:
        require(spec)


def metric_name(text: str) -> str:
    """A name part every tracker takes: Δ → ``delta_``, ↑/↓ → ``up``/``down``, each run of other characters outside
    ``[A-Za-z0-9_.-]`` → ``_`` (none at the ends): ``ΔHard`` → ``delta_Hard``, ``ce (null)`` → ``ce_null``."""
    text = text.replace("Δ", "delta_").replace("↑", "up").replace("↓", "down")
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")


def flat(params: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested settings as ``section.key`` → text (lists and scalars as JSON)."""
    out: dict[str, str] = {}
    for k, v in params.items():
        if isinstance(v, dict) and v:
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v if isinstance(v, str) else json.dumps(v, default=str)
    return out


def run_params(cfg: ExperimentConfig) -> dict[str, Any]:
    """The settings a tracker logs: results.json's ``config`` (:func:`~mr2probe.runstore.config_record`), the
    features, the reference and the training profile; JSON types only."""
    record = {**config_record(cfg), "features": str(cfg.features), "reference": cfg.reference_method,
              "profile": cfg.profile.describe()}
    return json.loads(json.dumps(record, default=str))


def table_columns(s: Summary) -> list[str]:
    """The table's mean ± SD columns (:meth:`~mr2probe.summary.Summary.numeric_columns`) and Top5 / BalancedAcc
    where the run has them."""
    return s.numeric_columns() + s.extra_columns()


def final_table(s: Summary) -> pd.DataFrame:
    """The final table as numbers: one row per method, the seed mean (%) of every column of the table
    (:func:`table_columns`), the replicates and the ΔHard verdict."""
    frame = s.frame()
    df = frame[[c for c in table_columns(s) if c in frame]].copy()
    df["seeds"] = frame["seeds"]
    df["verdict"] = [s.verdict_text(m) for m in s.methods]
    return df.reset_index()


def final_scalars(s: Summary) -> dict[str, float]:
    """``final/<method>/<column>`` → the seed mean (%) of every finite number of the table."""
    cols = table_columns(s)
    return {f"final/{metric_name(m)}/{metric_name(c)}": float(v) for m in s.methods
            for c, v in s.mean[m].items() if c in cols and math.isfinite(v)}


class Tracking:
    """What ``train`` and ``bench`` log to a run's tracker (none: every call does nothing)."""

    def __init__(self, tracker: Tracker | None, select: str = "acc") -> None:
        self.tracker, self.select = tracker, select

    def epoch(self, seed: int, epoch: int, scores: dict[str, float]) -> None:
        """Each method's best val score (fraction) after ``epoch`` epochs of seed ``seed``'s stack, in %."""
        if self.tracker is not None:
            self.tracker.scalars({f"val_{self.select}/{metric_name(m)}/seed{seed}": 100 * v
                                  for m, v in scores.items()}, epoch)

    def final(self, s: Summary, run_dir: Path) -> None:
        """The final table, its numbers, how it was read (groups, margin) and the run folder's table files."""
        if self.tracker is None:
            return
        self.tracker.params({"report": {"groups_on": s.group_on, "equivalence_margin": s.margin}})
        self.tracker.final_scalars(final_scalars(s))
        self.tracker.table("final/table", final_table(s))
        self.tracker.files([Path(run_dir) / f for f in FINAL_FILES if (Path(run_dir) / f).is_file()])


@contextlib.contextmanager
def tracked(cfg: ExperimentConfig | None, name: str, group: str | None = None) -> Iterator[Tracking]:
    """The tracker of ``cfg.train.log`` for run ``name`` (``group``: the suite), its settings logged; on rank 0
    only, and a no-op :class:`Tracking` without one (or without ``cfg``). Closed at the end, as failed when the
    block raises."""
    spec = parse_spec(cfg.train.log) if cfg is not None else None
    lib = require(spec) if spec is not None else None  # on every rank: a missing library stops them all
    if spec is None or rank_world()[0] != 0:
        yield Tracking(None)
        return
    tracker = TRACKERS.get(spec.scheme)(lib, spec.target, name, group)
    failed = True
    try:
        tracker.params(run_params(cfg))
        yield Tracking(tracker, cfg.select)
        failed = False
    finally:
        tracker.close(failed)


# ---- the trackers ----------------------------------------------------------------------------------------

@TRACKERS.register("tensorboard", "TensorBoard event files in DIR/RUN (tensorboard:DIR)")
class TensorBoard(Tracker):
    """torch's ``SummaryWriter``: scalars, the settings and the table as markdown text."""

    module, extra, needs_target = "torch.utils.tensorboard", "tensorboard", "a folder"

    def __init__(self, lib: ModuleType, target: str, name: str, group: str | None) -> None:
        self.logdir = Path(target) / (group or "") / name
        self.writer = lib.SummaryWriter(log_dir=str(self.logdir))

    def params(self, params: dict[str, Any]) -> None:
        rows = pd.DataFrame(list(flat(params).items()), columns=["setting", "value"])
        self.writer.add_text("config", rows.to_markdown(index=False))

    def scalars(self, values: dict[str, float], step: int) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, global_step=step)

    def table(self, name: str, df: pd.DataFrame) -> None:
        self.writer.add_text(name, df.to_markdown(index=False, floatfmt=".2f"))

    def files(self, paths: list[Path]) -> None:
        for p in paths:
            if p.suffix == ".md":
                self.writer.add_text(f"files/{p.name}", p.read_text(encoding="utf-8"))

    def close(self, failed: bool) -> None:
        self.writer.close()


@TRACKERS.register("mlflow", "an MLflow run in the tracking store URI (mlflow[:URI])")
class MLflow(Tracker):
    """``MlflowClient``: params, metrics with their step, the table (``log_table``) and the files as artifacts."""

    module, extra = "mlflow", "mlflow"

    def __init__(self, lib: ModuleType, target: str, name: str, group: str | None) -> None:
        from mlflow.tracking import MlflowClient

        self.lib = lib
        try:
            self.client = MlflowClient(tracking_uri=target or None)
            experiment = group or DEFAULT_NAME
            found = self.client.get_experiment_by_name(experiment)
            eid = found.experiment_id if found is not None else self.client.create_experiment(experiment)
            self.run_id = self.client.create_run(eid, run_name=name).info.run_id
        except lib.exceptions.MlflowException as e:
            raise UserError(f"--log mlflow:{target}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") \
                from None

    def params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        self.client.log_batch(self.run_id, params=[Param(k, v) for k, v in flat(params).items()])

    def scalars(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(1000 * time.time())
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()])

    def table(self, name: str, df: pd.DataFrame) -> None:
        self.client.log_table(self.run_id, df, f"{name}.json")

    def files(self, paths: list[Path]) -> None:
        for p in paths:
            self.client.log_artifact(self.run_id, str(p))

    def close(self, failed: bool) -> None:
        self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")


@TRACKERS.register("wandb", "a Weights & Biases run in PROJECT (wandb[:[ENTITY/]PROJECT])")
class WandB(Tracker):
    """``wandb.init``: the settings as the run's config, val scores against ``epoch``, final scalars in the run's
    summary, the table as a ``wandb.Table`` and the files as an artifact."""

    module, extra = "wandb", "wandb"

    def __init__(self, lib: ModuleType, target: str, name: str, group: str | None) -> None:
        entity, _, project = target.rpartition("/")
        self.lib, self.run_name = lib, name
        self.run = lib.init(project=project or DEFAULT_NAME, entity=entity or None, name=name, group=group,
                            reinit="create_new")
        self.run.define_metric("epoch")
        self.run.define_metric("val_*", step_metric="epoch")

    def params(self, params: dict[str, Any]) -> None:
        self.run.config.update(params, allow_val_change=True)

    def scalars(self, values: dict[str, float], step: int) -> None:
        self.run.log({"epoch": step, **values})

    def final_scalars(self, values: dict[str, float]) -> None:
        self.run.summary.update(values)

    def table(self, name: str, df: pd.DataFrame) -> None:
        self.run.log({name: self.lib.Table(dataframe=df)})

    def files(self, paths: list[Path]) -> None:
        if paths:
            art = self.lib.Artifact(re.sub(r"[^A-Za-z0-9_.-]", "-", f"{self.run_name}-tables"), type="results")
            for p in paths:
                art.add_file(str(p))
            self.run.log_artifact(art)

    def close(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)
