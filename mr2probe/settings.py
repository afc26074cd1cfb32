"""Every training setting, declared once.

A :class:`Setting` has one name, used unchanged everywhere: ``lr`` is the CLI flag ``--lr``, the suite's ``[train]
lr = ...`` key and the scikit-learn estimators' ``lr=`` parameter; ``min_steps`` is ``--min-steps``, ``[train]
min_steps`` and ``min_steps=``. Its kind, default and help live here and nowhere else: ``cli.py`` builds the
``train`` flags from :data:`TRAIN`, ``bench.py`` checks the ``[train]`` table against it, ``experiment.
config_from_settings`` turns values into an ``ExperimentConfig`` for both, and ``estimator.py`` generates its
estimators' ``__init__`` from the settings they take (with their own defaults where the estimator's protocol
differs: it converges like ``LogisticRegression`` on a hold-out of the data it is given).

The report's settings (how the tables are read: ``groups_on``, ``equivalence_margin``) are :data:`REPORT`: flags
of ``train`` and ``report`` and keys of a suite's ``[train]`` table like the training settings, but no part of a
run's config.

The extraction settings (``batch_size``, ``dtype``, ``pool``, …) are :data:`EXTRACT`: the flags of ``extract``
(``cli.py``), the keys of a recipe (``recipes.py``) and of a suite's ``[extract]`` table (``bench.py``; the readout
only in a recipe) and the fields of ``extract.ExtractConfig``, each checked by :meth:`Setting.check`.

Kinds: ``int``, ``float``, ``bool``, ``str``, ``floats`` (a grid: one number or several; on the CLI comma-separated,
in a suite a number or a list), ``size`` (bytes, ``"512MB"``, ``"8GiB"``, ``"auto"``), ``device`` (a torch device
or None = cuda if available).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .errors import UserError

KINDS = ("int", "float", "bool", "str", "floats", "size", "device")
NO_ESTIMATOR = object()  # a setting the estimators do not take
GROUPS_ON = {"val": "the reference's val accuracy, leave one replicate out: each replicate pair (method, reference) "
                    "is scored on all of test with groups ranked on the mean val accuracy of the reference's other "
                    "replicates (other episodes when there are several; the other seeds of its own episode where "
                    "the episodes' class counts differ, as a long-tailed profile's class order does), so no "
                    "replicate ranks its own groups",
             "val-pooled": "the reference's val accuracy (mean over all its replicates), scored on all of test: "
                           "the reference's own val noise chooses its hard classes (biased against it by "
                           "regression to the mean)",
             "crossfit": "the reference's accuracy on one class-stratified half of test (mean over seeds), scored "
                         "on the other half, and swapped; the two halves averaged",
             "test": "the reference's test accuracy (mean over seeds), scored on the same test images: biased, "
                     "regression to the mean credits any method that differs from the reference"}
"""How the hard / medium / easy groups are ranked (``groups_on``); the default is the first."""
EXACT_PROBE = "logreg"  # exact multinomial L2 logistic regression (L-BFGS, C on val): what a linear probe can reach
EXACT_PROBE_TOLERANCE = 0.5  # [choice] points; protocol.md: a CE probe reaches LogisticRegression within 0.5
BUDGET_RULES = {"floor": "max(epochs · ⌈N_train / batch⌉, min_steps) optimiser steps, whole epochs, the same for "
                         "every method",
                "reach-logreg": "min_steps doubled from the floor until the reference's best val score is within "
                                f"{EXACT_PROBE_TOLERANCE:g} point of {EXACT_PROBE}'s (C on val) or max_steps is "
                                "reached, on the first seed and episode; then the floor rule with that min_steps, "
                                "the same for every method",
                "checkpoints": "one run per seed stack to the largest of the checkpoints F·2ⁱ ≤ max_steps (F the floor "
                               "budget), a cosine schedule restarted at each; every head keeps its best checkpoint on "
                               "val, so each method's budget is selected on val with its other hyperparameters"}
"""How a run's step budget is set (``budget_rule``); the default is the first."""


@dataclass(frozen=True)
class Setting:
    """One setting: ``name`` (CLI ``--name-with-dashes``, suite key, estimator parameter), ``kind`` (see
    :data:`KINDS`), ``default``, ``help``; ``estimator``: the estimators' default when they take it, else
    :data:`NO_ESTIMATOR`. A bool that defaults to True appears on the CLI as ``--no-NAME``.

    The values it may take, declared here and checked by :meth:`check` wherever it is given: ``choices`` (a str
    setting), and for a number (each value of a grid) the bounds ``low`` ≤ v (``low_open``: low < v) and
    v ≤ ``high`` (``high_open``: v < high); a grid is never empty and its values are finite."""

    name: str
    kind: str
    default: Any
    help: str
    estimator: Any = NO_ESTIMATOR
    choices: tuple[str, ...] = ()  # the values a str setting may take (empty: any)
    low: float | None = None  # a number must be ≥ low (> low with low_open); None: no lower bound
    high: float | None = None  # a number must be ≤ high (< high with high_open); None: no upper bound
    low_open: bool = False
    high_open: bool = False

    @property
    def flag(self) -> str:
        """The CLI flag: ``--name-with-dashes``; ``--no-name`` for a bool that is on by default."""
        dashed = self.name.replace("_", "-")
        return f"--no-{dashed}" if self.kind == "bool" and self.default else f"--{dashed}"

    @property
    def rule(self) -> str:
        """The bounds as words: ``> 0``, ``≥ 1``, ``in (0, 1)``; ``finite and …`` for a grid; "" without bounds."""
        lo, hi = self.low, self.high
        if lo is not None and hi is not None:
            bound = f"in {'(' if self.low_open else '['}{lo:g}, {hi:g}{')' if self.high_open else ']'}"
        elif lo is not None:
            bound = f"{'>' if self.low_open else '≥'} {lo:g}"
        elif hi is not None:
            bound = f"{'<' if self.high_open else '≤'} {hi:g}"
        else:
            bound = ""
        return f"finite and {bound}" if self.kind == "floats" and bound else ("finite" if self.kind == "floats"
                                                                              else bound)

    def within(self, v: float) -> bool:
        """Whether the number ``v`` is inside the bounds (a grid value: and finite)."""
        lo_ok = self.low is None or (v > self.low if self.low_open else v >= self.low)
        hi_ok = self.high is None or (v < self.high if self.high_open else v <= self.high)
        return lo_ok and hi_ok and (self.kind != "floats" or math.isfinite(v))

    def check(self, value: Any, flag: str) -> Any:
        """``value`` if this setting may take it (:attr:`choices`, the bounds; a grid non-empty and finite), else
        one line: ``"{flag} must be > 0, got -1"``, ``"{flag} values must be finite and > 0, got [0.1, 0.0]"``,
        ``"{flag} must be one of …"``. None (a default chosen at run time) passes."""
        if self.kind == "floats":
            vals = list(value)
            if not vals or not all(self.within(v) for v in vals):
                raise UserError(f"{flag} values must be {self.rule}, got {vals}")
        elif self.kind in ("int", "float") and value is not None and not self.within(value):
            raise UserError(f"{flag} must be {self.rule}, got {value:g}")
        return self.check_choice(value, flag)

    def check_choice(self, value: Any, label: str) -> Any:
        """``value`` if it is one of :attr:`choices` (or there are none, or it is None); else a one-line
        :class:`UserError`."""
        if self.choices and value is not None and value not in self.choices:
            raise UserError(f"{label} must be one of {', '.join(self.choices)}, got {value!r}")
        return value

    def parse(self, value: Any, where: str) -> Any:
        """``value`` of a suite's or a file's table as this setting's type (a grid as a tuple of floats), checked
        by :meth:`check` (labelled ``"{where}: {name}"``); a one-line :class:`UserError` if it is not one."""
        number = (int, float)
        label = f"{where}: {self.name}"
        if self.kind == "floats":
            vals = value if isinstance(value, (list, tuple)) else [value]
            if vals and all(isinstance(v, number) and not isinstance(v, bool) for v in vals):
                return self.check(tuple(float(v) for v in vals), label)
        elif self.kind == "int" and isinstance(value, int) and not isinstance(value, bool):
            return self.check(value, label)
        elif self.kind == "float" and isinstance(value, number) and not isinstance(value, bool):
            return self.check(float(value), label)
        elif self.kind == "bool" and isinstance(value, bool):
            return value
        elif self.kind in ("str", "device") and isinstance(value, str):
            return self.check(value, label)
        elif self.kind == "size" and isinstance(value, (str, int)) and not isinstance(value, bool):
            return value
        raise UserError(f"{label} must be {_KIND_TEXT[self.kind]}, got {value!r}")


def check_all(settings: dict[str, Setting], values: dict[str, Any]) -> None:
    """:meth:`Setting.check` of every setting of ``settings`` that ``values`` holds, labelled by its CLI flag."""
    for name, value in values.items():
        if name in settings:
            settings[name].check(value, settings[name].flag)


_KIND_TEXT = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
              "floats": "a number or a list of numbers", "size": "a size (bytes, \"512MB\", \"8GiB\", \"auto\")",
              "device": "a torch device name"}


def parse_floats(text: str, flag: str) -> tuple[float, ...]:
    """A CLI grid: ``"1e-3,1e-2"`` → (0.001, 0.01)."""
    try:
        vals = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UserError(f"{flag} takes comma-separated numbers, got {text!r}") from None
    if not vals:
        raise UserError(f"{flag} takes comma-separated numbers, got {text!r}")
    return vals


TRAIN: dict[str, Setting] = {s.name: s for s in [
    Setting("epochs", "int", 30, "Training epochs; the budget is max(epochs · ⌈N/batch_size⌉, min_steps) optimiser "
            "steps, the same for every method (no epoch is picked on test).", estimator=30, low=1),
    Setting("min_steps", "int", 1000, "Floor of the training budget in optimiser steps, so small and few-shot sets "
            "converge (0 = epochs alone).", estimator=1000, low=0),
    Setting("budget_rule", "str", "floor", "Step budget: floor (max(epochs · ⌈N/batch_size⌉, min_steps)), "
            f"reach-logreg (min_steps doubled until the reference's val score is within {EXACT_PROBE_TOLERANCE:g} "
            f"point of {EXACT_PROBE}'s, up to max_steps; protocol: the reference must not be under-fit) or "
            "checkpoints (one run with checkpoints at the floor ×1, ×2, ×4, … ≤ max_steps, cosine warm restarts "
            "ending at each; the checkpoint is selected on val per method like lr).",
            choices=tuple(BUDGET_RULES)),
    Setting("max_steps", "int", 32000, "Ceiling in optimiser steps of the reach-logreg budget rule and of the "
            "checkpoints rule's last checkpoint.", low=1),
    Setting("search", "str", "full", "Grid search: full (every grid point trained for the whole budget), halving "
            "(successive halving, η = 3: at 1/9 and 1/3 of the step budget each method keeps the best third of its "
            "heads on val, the others stop; selection among the heads that reach the budget) or halving-restarts "
            "(the same, with the cosine schedule restarted at each rung, so heads are ranked annealed).",
            choices=("full", "halving", "halving-restarts")),
    Setting("batch_size", "int", 512, "Training batch size.", estimator=512, low=2),
    Setting("lr", "floats", (1e-3, 1e-2), "Learning-rate grid, selected on val.", estimator=None, low=0.0,
            low_open=True),
    Setting("wd", "floats", (1e-4, 1e-1), "AdamW (decoupled) weight-decay grid, selected on val.", estimator=None,
            low=0.0),
    Setting("l2", "floats", (0.0,), "Grid of a coupled L2 penalty ½·l2·‖W‖² on linear-head weights (the objective of "
            "L2 logistic regression with l2 = 1/(C·n)), selected on val.", estimator=None, low=0.0),
    Setting("method_grid", "bool", True, "Also search the methods' own grids (e.g. MR2's c̄); off: only lr × wd × "
            "l2 × scale."),
    Setting("width", "int", 256, "Adapter output width.", estimator=256, low=1),
    Setting("scale", "floats", (8.0, 16.0, 32.0, 64.0, 128.0, 256.0), "Cosine-head scale grid s, selected on val "
            "for every method alike; one value fixes it.", estimator=16.0, low=0.0, low_open=True),
    Setting("learn_scale", "bool", False, "Make the cosine scale trainable (from each grid value)."),
    Setting("select", "str", "acc", "Val score of the grid: acc (overall) or macc (mean per-class).",
            choices=("acc", "macc")),
    Setting("refit", "bool", False, "After selection on val, train each method's chosen grid point again on train "
            "+ val (the same epochs, so more steps; exact probes at their chosen C / k) and score that head on test; "
            "the val scores and the groups ranked on val stay the selection runs'."),
    Setting("val_fraction", "float", 0.1, "Stratified hold-out of train when the file has no val split (the "
            "estimators: the hold-out that chooses the grid point).", estimator=0.2, low=0.0, high=1.0,
            low_open=True, high_open=True),
    Setting("reference", "str", "ce", "Method that defines the hard / medium / easy groups and the Δ columns."),
    Setting("null", "bool", True, "Train the null control: the reference again on seeds N..2N-1, scored like a "
            "method."),
    Setting("episodes", "int", 1, "Seeded draws of a training profile, averaged like seeds (e.g. --train-profile "
            "shots:5 --episodes 5).", low=1),
    Setting("profile_seed", "int", 0, "Seed of the training profile's class order and draws."),
    Setting("max_memory", "size", "8GiB", "Memory for features: if train+val+test as float32 fit in SIZE they are "
            "loaded onto the device, else streamed from the file in shuffled blocks of about SIZE/2 (another data "
            "order; deterministic). SIZE: bytes, 512MB, 8GB (powers of 1000), 4GiB (of 1024), or 'auto' (half the "
            "free memory)."),
    Setting("device", "device", None, "torch device [cuda if available, else cpu].", estimator=None),
    Setting("compile", "str", "auto", "torch.compile the whole training step (forward, losses, backward, optimiser; "
            "fullgraph): auto (on a GPU), on or off. The heads are the same within float rounding.",
            choices=("auto", "on", "off")),
    Setting("cuda_graph", "bool", True, "On a GPU with the step compiled, capture it as a CUDA graph and replay it "
            "(captured again after each halving cut)."),
    Setting("tf32", "bool", True, "On a GPU, TF32 matrix products for float32 features (off: strict FP32)."),
    Setting("log", "str", "", "Experiment tracker (mr2probe.tracking): tensorboard:DIR, mlflow[:URI] or "
            "wandb[:PROJECT]; logs the settings, each method's best val score at every epoch end and the final "
            "table. Needs its extra (pip install 'mr2probe[wandb]'); empty: none. Not part of the run's key."),
]}


REPORT: dict[str, Setting] = {s.name: s for s in [
    Setting("groups_on", "str", "val", "Rank the groups on val, leaving each replicate out of its own "
            "ranking (default), val-pooled (all replicates), crossfit (halves of test, swapped) or test (biased; as "
            "many papers do).", choices=tuple(GROUPS_ON)),
    Setting("equivalence_margin", "float", 1.0, "Equivalence margin m of the tables' verdicts, in points: a method "
            "is 'equivalent' to the reference when the TOST at ±m rejects (its 90% CI inside ±m) and the difference "
            "is not significant.", low=0.0, low_open=True),
]}
"""The report's settings: flags of ``train`` and ``report``, keys of a suite's ``[train]`` table beside the training
settings; how the tables are read, not part of a run's config (:func:`split_report`)."""
TABLE = {**TRAIN, **REPORT}  # the settings a suite's [train] table, --config and the train flags hold

PREPROCESS = {"device": "workers read (and decode) the images; resize, crop and normalisation run batched on uint8 "
                        "tensors, on the encoder's CUDA device (JPEG decoding too) or, for a CPU encoder, in the "
                        "workers",
              "workers": "the DataLoader workers decode and run the encoder's PIL transform (the older pipeline)"}
"""Where images are preprocessed during extraction (``preprocess``); the default is the first."""
READOUT = ("pool", "blocks")  # the extraction settings that choose the encoder's output: a recipe's, not a suite's

EXTRACT: dict[str, Setting] = {s.name: s for s in [
    Setting("batch_size", "int", 64, "Images per forward pass.", low=1),
    Setting("workers", "int", -1, "DataLoader worker processes (-1 = cpus-1, at most 8).", low=-1),
    Setting("dtype", "str", "float16", "Stored feature dtype: float16 or float32.", choices=("float16", "float32")),
    Setting("amp", "str", "bf16", "Autocast on CUDA (ignored on a CPU): bf16, fp16 or off.",
            choices=("bf16", "fp16", "off")),
    Setting("runtime", "str", "auto", "CPU runtime for torch encoders: auto (onnxruntime when installed), torch or "
            "onnx.", choices=("auto", "torch", "onnx")),
    Setting("per_class", "int", None, "Stratified subset: at most N samples per class in each split (seeded).",
            low=1),
    Setting("device", "device", None, "torch device [cuda if available, else cpu]."),
    Setting("preprocess", "str", "device", "Where images are resized: device (on the encoder's device; JPEGs "
            "decoded there on CUDA) or workers (PIL).", choices=tuple(PREPROCESS)),
    Setting("pool", "str", None, "ViT token readout: cls, avg (patch mean) or cls+avg, after the final norm [the "
            "encoder's own pooled output].", choices=("cls", "avg", "cls+avg")),
    Setting("blocks", "int", None, "ViT readout of the last N blocks, concatenated (DINOv2's linear eval) [1].",
            low=1),
]}
"""The extraction settings: flags of ``extract``, keys of a recipe (``extract/*.toml``, with ``encoder``) and of a
suite's ``[extract]`` table (all but :data:`READOUT`, which names the feature file's readout and so belongs to
the recipe), fields of ``extract.ExtractConfig``; the same name everywhere."""


def check_table(values: dict[str, Any], where: str, extra: dict[str, Any] | None = None,
                table: dict[str, Setting] | None = None) -> dict[str, Any]:
    """A suite's ``[train]`` table (or another ``table`` of settings: a suite's ``[extract]``, a recipe): every key
    a setting of :data:`TABLE` (or one of ``extra``: name → python type), every value of its kind and within what
    the setting declares (:meth:`Setting.parse`); returns the values converted (grids as tuples)."""
    extra, table = extra or {}, TABLE if table is None else table
    unknown = sorted(set(values) - set(table) - set(extra))
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted([*table, *extra]))}")
    out = {}
    for key, value in values.items():
        if key in extra:
            if not isinstance(value, extra[key]):
                raise UserError(f"{where}: {key} has the wrong type ({value!r})")
            out[key] = value
        else:
            out[key] = table[key].parse(value, where)
    return out


def split_report(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(every :data:`REPORT` setting: the given value, else its default; the other values)."""
    report = {name: values.get(name, s.default) for name, s in REPORT.items()}
    return report, {k: v for k, v in values.items() if k not in REPORT}


def resolved(values: dict[str, Any]) -> dict[str, Any]:
    """Every :data:`TRAIN` setting: the given value, else its default. A name that is no training setting (a head,
    a report setting) is refused rather than dropped, so a caller cannot think it applied."""
    unknown = sorted(set(values) - set(TRAIN))
    if unknown:
        raise ValueError(f"not training settings: {', '.join(unknown)} (head, adapter and profile are arguments)")
    return {name: values.get(name, s.default) for name, s in TRAIN.items()}


def estimator_settings() -> dict[str, Setting]:
    """The settings the estimators take, in :data:`TRAIN` order."""
    return {n: s for n, s in TRAIN.items() if s.estimator is not NO_ESTIMATOR}
