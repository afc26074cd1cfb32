"""The method registry and the interface every training objective (CE, MR2, the baselines) implements.

A method instance serves a contiguous slice of h heads of a probe stack that share the method but may differ
in hyperparameters (grid points) — so every hyperparameter is read per head, as a tensor of shape [h]
(``self.hp("name")``), and ``loss`` returns one loss per head, shape [h]. The trainer sums the heads' losses
and takes one backward pass: heads have disjoint parameters, so each head gets exactly its own gradient.

To add a method: one file in mr2probe/methods/ with a ``Method`` subclass decorated by
``@METHODS.register("name")`` (the registry sets the class's ``name``); give it ``defaults`` (every hyperparameter
with its default) and a small ``grid`` (values searched on val, on top of the trainer's lr × weight-decay grid).

Besides the batch a method reads only ``self.ctx``, a frozen :class:`FitContext`: ``ctx.data`` (the training and
val data, K, n_k), ``ctx.heads`` (read-only views of its own heads: their representations z and g(x), their
predictions, the probe's shape), ``ctx.schedule`` (epochs, batch size, seed), ``ctx.shared`` (statistics of the
frozen features under typed keys, computed once per data), ``ctx.aux`` (the trainer's auxiliary stages and fresh
heads) and ``ctx.log``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Generic, Iterator, Protocol, TypeVar, runtime_checkable

import torch

from ..errors import UserError
from ..losses import LossTables, Terms, stack_loss, stack_loss_and_ce
from ..registry import Registry
from ..stats import ClassStats

if TYPE_CHECKING:
    from ..heads import HeadSet, ProbeConfig
    from ..source import StreamedFeatures


@dataclass
class Batch:
    """One training batch as a method sees it (only its own heads)."""

    logits: torch.Tensor | None  # [h, B, K] (what the method's own code reads; the stack's pass reads the stack's)
    rep: torch.Tensor  # [h or 1, B, d]: the representation the classifier sees (1 = shared, no adapter)
    y: torch.Tensor  # [B] labels
    idx: torch.Tensor  # [B] positions in the training set (for per-sample weights)


@dataclass(frozen=True)
class FitData:
    """The training and validation data, ``ctx.data``. ``x`` and ``val_x`` may be streamed from the feature file
    (larger than ``--max-memory``): use only their ``len``, ``shape``, ``dtype``, ``device`` and chunked slices
    ``x[i:j]`` (or the heads' ``predict``/``represent_train``); per-sample state is indexed by ``Batch.idx``."""

    x: "torch.Tensor | StreamedFeatures"  # [N, D] training features (device tensor, or streamed from the file)
    y: torch.Tensor  # [N] training labels
    val_x: "torch.Tensor | StreamedFeatures"  # the selection split (most methods never read it)
    val_y: torch.Tensor
    num_classes: int

    @property
    def counts(self) -> torch.Tensor:
        """n_k: training samples per class (in the features' dtype, [K])."""
        return torch.bincount(self.y, minlength=self.num_classes).to(self.x.dtype)

    @property
    def dtype(self) -> torch.dtype:
        """The features' dtype (that of every per-head tensor a method keeps)."""
        return self.x.dtype

    @property
    def device(self) -> torch.device:
        """The training device."""
        return self.x.device


@dataclass(frozen=True)
class FitSchedule:
    """``ctx.schedule``: the training run's epochs (the floor budget's, also under the ``checkpoints`` rule), batch
    size and seed (fixes the heads' initialisation and the data order)."""

    epochs: int
    batch_size: int
    seed: int


Chunks = Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]]  # no-grad (representation, labels) chunks


@dataclass(frozen=True)
class HeadsView:
    """``ctx.heads``: the method's own h heads of the probe stack, read-only. ``represent_input`` and
    ``represent_input_train`` are None where the context was built without a probe (tests, benchmarks)."""

    config: "ProbeConfig"  # the probe's shape: head kind, adapter, width, cosine scale
    rep_dim: int  # d, the width of the representation
    represent_train: Chunks  # z, what the classifiers see: ([h|1, b, d], y) over the training set, no grad
    predict: Callable[[torch.Tensor], torch.Tensor]  # features [n, D] → logits [h, n, K], no grad
    # g(x), the representation before the head's own transform (cosine: before z/‖z‖; no adapter: the features x)
    represent_input_train: Chunks | None = None  # ([h|1, b, d], y) over the training set, no grad
    represent_input: Callable[[torch.Tensor], torch.Tensor] | None = None  # training positions [B] → g(x) [h|1, B,
    # d] with grad (a second adapter pass on x[idx])


@runtime_checkable
class Auxiliary(Protocol):
    """``ctx.aux``: what the trainer offers a method beyond its own heads (``trainer.AuxiliaryStages``)."""

    def train(self, method: str, hparams: list[dict[str, Any]], epochs: int) -> torch.Tensor:
        """An auxiliary stage (JTT's first stage): a separate stack of heads of ``method`` — one per ``hparams``
        (lr and weight_decay included), on the same training data, seed and probe — trained for ``epochs``; returns
        their logits on the training set [len(hparams), N, K]."""
        ...

    def new_heads(self, seeds: list[int], scales: list[float]) -> HeadSet:
        """Fresh classifier heads of the probe's kind on the representation (width ``rep_dim``, K classes), one per
        seed (and cosine scale), on the training device and dtype: heads a method trains itself (LfF's biased
        heads, listed in its ``extra_parameters``)."""
        ...


V = TypeVar("V")


@dataclass(frozen=True)
class SharedKey(Generic[V]):
    """Base of the keys of :class:`SharedStats`: a frozen dataclass whose fields are all a value depends on
    besides the frozen features; ``V`` is the type of the value. Keys of different classes never collide."""


@dataclass(frozen=True)
class ClassStatsKey(SharedKey[ClassStats]):
    """The class statistics (:func:`~mr2probe.stats.class_stats_chunked`) of the frozen representation under a
    head kind (``head``: its own transform, cosine z/‖z‖), measured on ``stats_on`` (``input``: g(x),
    ``classifier``: z) with the norm ``p``."""

    head: str
    stats_on: str
    p: float


class SharedStats:
    """``ctx.shared``: values that depend on the frozen features alone, computed once per training data (the
    trainer's ``TrainData.shared``) and shared by every stack on it: the other seeds, chunks and auxiliary stages
    (e.g. MR2's class statistics without an adapter, the same for every MR2-family slice and seed)."""

    def __init__(self) -> None:
        self._values: dict[SharedKey[Any], Any] = {}

    def get_or_compute(self, key: SharedKey[V], compute: Callable[[], V]) -> V:
        """The value under ``key``, computed by ``compute()`` the first time it is asked for."""
        if not isinstance(key, SharedKey):
            raise TypeError(f"shared statistics are keyed by a SharedKey dataclass, got {type(key).__name__}")
        if key not in self._values:
            self._values[key] = compute()
        return self._values[key]

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def __len__(self) -> int:
        return len(self._values)


def _silent(message: str) -> None:
    """A log that drops its lines."""


class _NoAuxiliary:
    """The ``aux`` of a context built without a trainer (a unit test, a benchmark): it offers nothing."""

    def train(self, method: str, hparams: list[dict[str, Any]], epochs: int) -> torch.Tensor:
        raise RuntimeError("this FitContext was built without a trainer: no auxiliary stage")

    def new_heads(self, seeds: list[int], scales: list[float]) -> HeadSet:
        raise RuntimeError("this FitContext was built without a trainer: no auxiliary heads")


@dataclass(frozen=True)
class FitContext:
    """All a method may use besides the batch, read-only: ``data`` (:class:`FitData`), ``heads`` (its own heads,
    :class:`HeadsView`), ``schedule`` (:class:`FitSchedule`), ``shared`` (:class:`SharedStats`), ``aux`` (the
    trainer's auxiliary stages and heads, :class:`Auxiliary`) and ``log`` (one line to the run's log)."""

    data: FitData
    heads: HeadsView
    schedule: FitSchedule
    aux: Auxiliary = field(default_factory=_NoAuxiliary)
    shared: SharedStats = field(default_factory=SharedStats)
    log: Callable[[str], None] = _silent


class Method:
    """Base class. A method declares its loss (``terms``; ``sample_weights``, ``aux_logits``, ``extra_loss`` where
    the form needs them; :mod:`mr2probe.losses`); optionally ``prepare``, ``on_epoch_start``,
    ``extra_parameters``, ``info``. ``loss`` evaluates it alone."""

    name: ClassVar[str] = ""
    defaults: ClassVar[dict[str, Any]] = {}
    grid: ClassVar[dict[str, list]] = {}
    adapter_grid: ClassVar[dict[str, list]] = {}  # searched too when the adapter is trainable
    words: ClassVar[dict[str, tuple[str, ...]]] = {}  # words a hyperparameter takes besides its default's type
    needs_adapter: ClassVar[bool] = False  # refuse to run without a trainable adapter
    detach_head_input: ClassVar[bool] = False  # the head's loss does not train the adapter (e.g. SupCon)

    def __init__(self, hparams: list[dict[str, Any]], ctx: FitContext) -> None:
        self.hparams, self.ctx, self.h = hparams, ctx, len(hparams)
        for key in hparams[0] if hparams else ():  # every numeric hyperparameter's tensor now, not at a first step
            # (state that appears mid-training would make a compiled step compile again)
            if all(isinstance(hp.get(key), (int, float)) for hp in hparams):
                self.hp(key)

    @classmethod
    def check(cls, hparams: dict[str, Any]) -> None:
        """Refuse invalid hyperparameter values with a one-line UserError (override per method)."""

    @classmethod
    def check_types(cls, hparams: dict[str, Any]) -> None:
        """Every hyperparameter has the type of its default: true/false, an integer, a finite number or a string
        (so that ``--set jtt.stage1_epochs=1e30`` or ``--set focal.gamma=NaN`` is refused before training), or
        one of the words ``cls.words`` allows for it (e.g. LDAM's s = "head")."""
        for key, default in cls.defaults.items():
            v = hparams.get(key, default)
            if v in cls.words.get(key, ()):
                continue
            number = isinstance(v, (int, float)) and not isinstance(v, bool)
            if isinstance(default, bool):
                ok, want = isinstance(v, bool), "true or false"
            elif isinstance(default, int):
                ok, want = number and isinstance(v, int), "an integer"
            elif isinstance(default, float):
                ok, want = number and math.isfinite(v), "a finite number"
            elif isinstance(default, str):
                ok, want = isinstance(v, str), "a string"
            else:
                continue
            if not ok:
                words = " or ".join(f'"{w}"' for w in cls.words.get(key, ()))
                raise UserError(f"{key} must be {want}{' or ' + words if words else ''}, got {v!r}")

    def head_scales(self) -> list[float]:
        """Each head's cosine scale s (the grid point its run was given, else the probe's fixed scale)."""
        return [float(hp.get("scale", self.ctx.heads.config.scale)) for hp in self.hparams]

    def hp(self, key: str) -> torch.Tensor:
        """Hyperparameter ``key`` of each head, float tensor [h] on the training device (built once: losses
        read it every step, and a host→device copy per step would stall a GPU)."""
        cache = self.__dict__.setdefault("_hp_cache", {})
        if key not in cache:
            cache[key] = torch.tensor([float(hp[key]) for hp in self.hparams], dtype=self.ctx.data.dtype,
                                      device=self.ctx.data.device)
        return cache[key]

    def prepare(self) -> None:
        """Once, before the first epoch (e.g. class statistics of frozen features, JTT's first stage)."""

    def on_epoch_start(self, epoch: int) -> None:
        """At the start of every epoch (e.g. statistics under a trainable adapter, DRO/CDB weights)."""

    # --- the method's loss, as the stack evaluates it (mr2probe.losses): declared terms, hooks, extra terms ---

    def terms(self) -> Terms:
        """The softmax-CE form's terms of this method's heads (:class:`~mr2probe.losses.Terms`; plain CE: none).
        Read after ``prepare``, after every ``on_epoch_start`` and, for ``per_step_terms`` methods, every step."""
        return Terms()

    per_step_terms: ClassVar[bool] = False  # terms() changes within an epoch (after ``before_step``)
    reweights: ClassVar[bool] = False  # sample_weights() is a per-step hook

    def before_step(self, batch: Batch) -> None:
        """Before each step's loss (e.g. MR2's EMA statistics, which then change ``terms()``)."""

    def sample_weights(self, c: torch.Tensor, batch: Batch, c_aux: torch.Tensor | None) -> torch.Tensor:
        """Per-step weights r [h, B] of this method's heads from their per-sample losses c [h, B] (detached, before
        ψ) and those of its auxiliary rows ``c_aux`` (see :meth:`aux_logits`); only where ``reweights``."""
        raise NotImplementedError

    def aux_logits(self, batch: Batch) -> torch.Tensor | None:
        """Logits [h, B, K] of auxiliary heads the method owns (LfF's biased heads), trained in the same pass under
        :meth:`aux_terms`; their losses add to the method's."""
        return None

    def aux_terms(self) -> Terms:
        return Terms()

    def extra_loss(self, batch: Batch) -> torch.Tensor | None:
        """A per-head loss [h] outside the softmax-CE form (MR2's representation term, SupCon), with autograd."""
        return None

    def loss(self, batch: Batch) -> torch.Tensor:
        """Per-head training loss [h] of this method alone: the stack's passes (mr2probe.losses) over its heads
        (and its auxiliary heads first, whose c its hook may read)."""
        self.before_step(batch)
        z, k = batch.logits, batch.logits.shape[2]
        tables = LossTables(self.h, k, z.device, z.dtype)
        tables.write(slice(0, self.h), self.terms())
        aux = self.aux_logits(batch)
        out, c_aux = 0.0, None
        if aux is not None:
            aux_tables = LossTables(aux.shape[0], k, z.device, z.dtype)
            aux_tables.write(slice(0, aux.shape[0]), self.aux_terms())
            out, c_aux = stack_loss_and_ce(aux, batch.y, aux_tables)
        hooks = [(slice(0, self.h), lambda c: self.sample_weights(c, batch, c_aux))] if self.reweights else []
        out = stack_loss(z, batch.y, tables, hooks) + out
        extra = self.extra_loss(batch)
        return out if extra is None else out + extra

    def stateless(self) -> bool:
        """Whether the loss carries nothing from step to step: all it reads besides the batch is computed by
        ``prepare`` and ``on_epoch_start`` from the hyperparameters and the data, and it owns no parameters. Then an
        instance built for some of the heads (and brought to the epoch) trains them exactly as this one does, and
        successive halving rebuilds it for a cut's survivors rather than computing the loss of stopped heads."""
        return False

    def extra_parameters(self) -> list[torch.Tensor]:
        """Method-owned trainable tensors with leading axis h (optimised with the heads' lr and wd)."""
        return []

    def info(self) -> list[dict[str, Any]]:
        """Per-head extra results (e.g. MR2's margins), JSON-able; stored in results.json."""
        return [{} for _ in range(self.h)]


LSE_MAX_CLASSES = 32  # up to this K, per_head_ce takes the logsumexp form; above it, log_softmax then gather


def per_head_ce(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of every sample under every head: logits [h, B, K], y [B] → [h, B],
    ℓ_hb = logsumexp_k z_hbk − z_hby_b = −log softmax(z_hb)_y_b.

    Both forms reduce over the last (contiguous) axis. Cross-entropy over the class axis of [h, K, B] (the
    transposed layout) runs the "spatial" softmax kernels: about 25× below memory bandwidth on a GPU and 3–6×
    slower on a CPU at K ≥ 100 (benchmarks/gpu_step.py). On a CPU the logsumexp form is the faster one at small K,
    log_softmax + gather at large K."""
    target = y.expand(logits.shape[0], -1).unsqueeze(-1)  # [h, B, 1]
    if logits.shape[-1] <= LSE_MAX_CLASSES:
        return torch.logsumexp(logits, -1) - logits.gather(-1, target).squeeze(-1)
    return -torch.log_softmax(logits, -1).gather(-1, target).squeeze(-1)


METHODS: Registry[type[Method]] = Registry("method", base=Method, group="mr2probe.methods")


def resolve_methods(methods: str | list[str], adapter: str) -> tuple[list[str], list[str]]:
    """Method names from a comma-separated string or a list, where ``all`` stands for every registered method that
    can run with ``adapter`` (e.g. ``"all,logreg,knn"``); returns (names, those ``all`` left out because they need
    a trainable adapter)."""
    items = methods.split(",") if isinstance(methods, str) else list(methods)
    names: list[str] = []
    skipped: list[str] = []
    for m in (item.strip() for item in items):
        if m == "all":
            runnable = [n for n in METHODS.names() if adapter != "none" or not METHODS.get(n).needs_adapter]
            names += runnable
            skipped = sorted(set(METHODS.names()) - set(runnable))
        elif m:
            names.append(m)
    return list(dict.fromkeys(names)), skipped
