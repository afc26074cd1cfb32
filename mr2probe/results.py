"""The run model: a run folder's results.json as typed records, read from every layout mr2probe has written.

:class:`RunResults` is the file (``schema`` :data:`SCHEMA`); each of its ``runs`` is a :class:`RunRecord` (one
method × seed × episode: the grid point selected on val and its test score), its ``budget`` a :class:`Budget`.
:meth:`RunResults.from_disk` reads any results.json mr2probe wrote; :meth:`RunResults.to_dict` is what
:meth:`RunResults.write` puts on disk. The earlier layouts (no ``schema``, "mr2probe.results/1") are read by the
shims of this module and nowhere else:

* no ``profile``, ``budget``, ``episodes``, ``null_control``, ``train_class_counts`` (before training profiles and
  budget rules): a full training set, and None for the others;
* a run without ``episode`` (before profiles): episode 0;
* a run's ``grid`` as one dict per point (before the column layout): read by :func:`~mr2probe.jsonfile.grid_rows`;
* ``config.train`` without ``search`` (before successive halving, and every full search until this schema) or
  ``budget_rule`` (before budget rules): ``full`` and ``floor``, what those runs did;
* no ``reference``: the first method of the lowest seed;
* ``config.train``'s grids and method-grid switch under their earlier names (``lrs``, ``weight_decays``, ``l2s``,
  ``scales``, ``use_method_grids``; :data:`LEGACY_TRAIN_NAMES`): read under the settings' names (``lr``, ``wd``,
  ``l2``, ``scale``, ``method_grid``), which results.json has held since.

Other absent fields stay absent (None): a setting that did not exist then is not claimed to have had today's
default.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .errors import UserError
from .jsonfile import atomic_json, grid_columns, grid_rows
from .profiles import Profile

SCHEMA = "mr2probe.results/2"
LEGACY_SCHEMA = "mr2probe.results/1"  # every results.json written before the schema field
AS_MADE = ("provenance", "notes", "config", "mr2probe_version", "schema")  # how a run was made, not its numbers
LEGACY_TRAIN_DEFAULTS = {"search": "full", "budget_rule": "floor"}  # what a run made before the setting did
LEGACY_TRAIN_NAMES = {"lrs": "lr", "weight_decays": "wd", "l2s": "l2", "scales": "scale",
                      "use_method_grids": "method_grid"}
"""``config.train`` keys of earlier results.json files → the settings' names (:data:`~mr2probe.settings.TRAIN`)
they are read under; part keys are still hashed under the earlier names (``runstore.KEY_NAMES``)."""


@dataclass
class RunRecord:
    """One run of the table: ``method`` on ``seed`` (and training-profile ``episode``) with the grid point
    selected on val (``hparams``, its ``val_score`` under ``select``), scored once on test (``test_acc``,
    ``per_class_acc``; ``test_top5_acc``: the share of test images whose class is among the head's 5 largest
    logits (logreg: its fitted model's, knn: its vote shares), None for runs made before it was stored);
    ``grid``: every grid point, one dict per point (``hparams``, ``val_score``, and under the checkpoints rule /
    successive halving ``checkpoint_step`` / ``stopped_at``). ``checkpoint_step`` / ``checkpoint_val_scores``:
    the selected head's checkpoint under the checkpoints rule; ``reference_probe``: an exact probe's fit details;
    ``refit``: under ``--refit``, what the head scored on test was trained again on (``train_rows`` = N_train +
    N_val, and for trained heads ``epochs`` and ``steps``), None for a head trained on train alone (and every
    older run); ``info``: what the method records of itself (MR2: ``margins``, ``variability``, ``s_bar``)."""

    method: str
    seed: int
    per_class_acc: list[float]
    hparams: dict[str, Any] = field(default_factory=dict)
    val_score: float | None = None
    select: str | None = None
    test_acc: float | None = None
    test_top5_acc: float | None = None
    val_per_class_acc: list[float] | None = None
    grid: list[dict[str, Any]] = field(default_factory=list)
    episode: int = 0
    stack_wall_time_s: float | None = None
    checkpoint_step: int | None = None
    checkpoint_val_scores: list[float] | None = None
    reference_probe: dict[str, Any] | None = None
    refit: dict[str, Any] | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """The run's name in predictions.npz and heads.safetensors: ``method/seed``."""
        return f"{self.method}/{self.seed}"

    @property
    def margins(self) -> list[float] | None:
        """MR2's per-class margins γ_k, when the method records them."""
        return self.info.get("margins")

    @property
    def variability(self) -> list[float] | None:
        """MR2's per-class variability v_k, when the method records it."""
        return self.info.get("variability")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunRecord:
        """A run as results.json or a part file holds it (any layout); keys that are no field go to ``info``."""
        names = {f.name for f in fields(cls)} - {"info", "grid"}
        known = {k: v for k, v in d.items() if k in names}
        info = {**d.get("info", {}), **{k: v for k, v in d.items() if k not in names | {"info", "grid"}}}
        known["episode"] = int(known.get("episode", 0))  # legacy: runs made before training profiles
        return cls(**known, grid=grid_rows(d.get("grid")), info=info)

    def to_dict(self) -> dict[str, Any]:
        """The run as results.json holds it: the grid as columns, absent (None) optional fields left out."""
        d = {"method": self.method, "seed": self.seed, "hparams": self.hparams, "val_score": self.val_score,
             "select": self.select, "test_acc": self.test_acc,
             "test_top5_acc": self.test_top5_acc, "per_class_acc": self.per_class_acc,
             "val_per_class_acc": self.val_per_class_acc, "grid": grid_columns(self.grid),
             "checkpoint_step": self.checkpoint_step, "checkpoint_val_scores": self.checkpoint_val_scores,
             "stack_wall_time_s": self.stack_wall_time_s, "reference_probe": self.reference_probe,
             "refit": self.refit}
        return {**{k: v for k, v in d.items() if v is not None}, **self.info, "episode": self.episode}

    def check(self, k: int) -> None:
        """A ValueError unless the run has ``k`` per-class accuracies, an int seed and a str method."""
        if len(self.per_class_acc) != k or not isinstance(self.seed, int) or not isinstance(self.method, str):
            raise ValueError(f"run {self.method}/{self.seed} has a malformed per_class_acc/seed/method")


@dataclass
class Budget:
    """How many optimiser steps every head trained: ``steps`` = ``epochs`` · ``steps_per_epoch`` (whole epochs of
    an episode's training rows, at least ``min_steps``) under ``rule`` (its description,
    :data:`~mr2probe.settings.BUDGET_RULES`); the reach-logreg rule's ``calibration``; the checkpoints rule's
    ``checkpoints`` (first: ``floor_steps``, up to ``max_steps``); successive halving's rungs (``search``)."""

    steps: int | None = None
    epochs: int | None = None
    steps_per_epoch: int | None = None
    min_steps: int | None = None
    batch_size: int | None = None
    rule: str | None = None
    calibration: dict[str, Any] | None = None
    checkpoints: list[int] | None = None
    floor_steps: int | None = None
    max_steps: int | None = None
    search: list[Any] | dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Budget | None:
        """results.json's ``budget``; None where the file has none (runs made before budget rules)."""
        return cls(**d) if d else None

    def to_dict(self) -> dict[str, Any]:
        """As results.json holds it: the rule's optional records only when there are any."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


def full_profile() -> dict[str, Any]:
    """results.json's ``profile`` of a run on the whole training set (what a run made before profiles used)."""
    p = Profile()
    return {**p.as_dict(), "describe": p.describe()}


@dataclass
class RunResults:
    """A run folder's results.json: the classes and their test counts, every run (:class:`RunRecord`), the
    ``reference`` that defines the groups and its ``null_control`` (method name and seeds), the step ``budget``,
    the training ``profile`` (with ``describe``) and its ``episodes`` (draw seed, class counts), the ``head`` and
    ``adapter``; how it was made: ``config`` (the settings as given), ``provenance`` (features, software,
    machine, command), ``notes`` (what training said), ``mr2probe_version``."""

    class_names: list[str]
    test_class_counts: list[int]
    runs: list[RunRecord]
    reference: str
    head: str = "?"
    adapter: str = "none"
    null_control: dict[str, Any] | None = None
    budget: Budget | None = None
    profile: dict[str, Any] = field(default_factory=full_profile)
    train_class_counts: list[int] | None = None
    episodes: list[dict[str, Any]] | None = None
    config: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    mr2probe_version: str | None = None
    schema: str = SCHEMA

    @property
    def dataset(self) -> str:
        """The dataset's name, as the feature file records it ("?" when unknown)."""
        return str(self.provenance.get("dataset", "?"))

    @property
    def encoder(self) -> str:
        """The encoder's name, as the feature file records it ("?" when unknown)."""
        return str(self.provenance.get("encoder", "?"))

    @property
    def val_size(self) -> int | None:
        """How many val images selected the grid points (None when not recorded)."""
        return (self.provenance.get("splits") or {}).get("val")

    def by_method(self) -> dict[str, list[RunRecord]]:
        """Every method's runs, ordered by seed (methods in the order of their first run among them)."""
        out: dict[str, list[RunRecord]] = {}
        for run in sorted(self.runs, key=lambda r: r.seed):
            out.setdefault(run.method, []).append(run)
        return out

    def runs_of(self, method: str) -> list[RunRecord]:
        """The method's runs, in file order."""
        return [r for r in self.runs if r.method == method]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunResults:
        """The results of a results.json's content, of any layout (see the module's list of shims); a
        ValueError/KeyError/TypeError when it is none."""
        if not isinstance(d, dict) or not d.get("runs"):
            raise ValueError("it holds no runs")
        runs = [RunRecord.from_dict(r) for r in d["runs"]]
        reference = d.get("reference") or min(runs, key=lambda r: r.seed).method
        config = dict(d.get("config") or {})
        if "train" in config:
            config["train"] = {**LEGACY_TRAIN_DEFAULTS,
                               **{LEGACY_TRAIN_NAMES.get(k, k): v for k, v in config["train"].items()}}
        res = cls(class_names=list(d["class_names"]), test_class_counts=list(d["test_class_counts"]), runs=runs,
                  reference=reference, head=d.get("head", "?"), adapter=d.get("adapter", "none"),
                  null_control=d.get("null_control"), budget=Budget.from_dict(d.get("budget")),
                  profile=d.get("profile") or full_profile(), train_class_counts=d.get("train_class_counts"),
                  episodes=d.get("episodes"), config=config, provenance=d.get("provenance") or {},
                  notes=list(d.get("notes") or []), mr2probe_version=d.get("mr2probe_version"),
                  schema=d.get("schema", LEGACY_SCHEMA))
        res.check()
        return res

    @classmethod
    def coerce(cls, results: RunResults | dict[str, Any]) -> RunResults:
        """``results`` as :class:`RunResults` (a results.json's content is read by :meth:`from_dict`)."""
        return results if isinstance(results, RunResults) else cls.from_dict(results)

    @classmethod
    def from_disk(cls, path: str | Path) -> RunResults:
        """Read ``path`` (a results.json, or a run folder holding one); every problem is one :class:`UserError`."""
        path = Path(path)
        path = path / "results.json" if path.is_dir() or path.suffix != ".json" else path
        if not path.is_file():
            raise UserError(f"{path} not found: run `mr2probe train --out {path.parent}` first")
        try:
            d = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError) as e:
            raise UserError(f"{path} is not valid JSON ({e}); train again") from None
        if not isinstance(d, dict) or not d.get("runs"):
            raise UserError(f"{path} holds no runs")
        try:
            return cls.from_dict(d)
        except (KeyError, TypeError, ValueError) as e:
            what = f"missing field {e}" if isinstance(e, KeyError) else str(e)
            raise UserError(f"{path} is not a mr2probe results file ({what}); train again") from None

    def check(self) -> None:
        """A ValueError unless every list of per-class values has one entry per class."""
        k = len(self.class_names)
        if len(self.test_class_counts) != k:
            raise ValueError("test_class_counts and class_names differ in length")
        for r in self.runs:
            r.check(k)

    def to_dict(self) -> dict[str, Any]:
        """The results as results.json holds them (``schema`` first; optional records left out when absent)."""
        d = {"schema": self.schema, "mr2probe_version": self.mr2probe_version, "class_names": self.class_names,
             "test_class_counts": self.test_class_counts, "reference": self.reference,
             "null_control": self.null_control, "budget": self.budget.to_dict() if self.budget else None,
             "profile": self.profile, "train_class_counts": self.train_class_counts, "episodes": self.episodes,
             "head": self.head, "adapter": self.adapter, "config": self.config, "provenance": self.provenance,
             "notes": self.notes, "runs": [r.to_dict() for r in self.runs]}
        return {k: v for k, v in d.items() if v is not None or k == "null_control"}

    def numbers(self) -> dict[str, Any]:
        """:meth:`to_dict` without the fields of :data:`AS_MADE` (how the run was made or shown), as JSON
        values: equal for two files of the same numbers, whatever their layout."""
        return json.loads(json.dumps({k: v for k, v in self.to_dict().items() if k not in AS_MADE}, default=str))

    def write(self, path: Path) -> None:
        """Write :meth:`to_dict` to ``path`` atomically (the layout of :func:`~mr2probe.jsonfile.json_text`)."""
        atomic_json(path, self.to_dict())
