"""The trainer: many probe heads trained together on cached features (one stack per seed).

All runs that share a seed (every method × grid point) form one ``ProbeStack``: one matrix product evaluates
all their logits on a batch, each method computes its heads' losses vectorised, one backward pass, and a
``StackedAdamW`` step with per-head lr and weight decay. A run's seed fixes both its initialisation and its
data order, so a head trained inside a stack follows the same trajectory as trained alone (up to float
rounding of the larger product).

Under the ``checkpoints`` budget rule a stack trains once, for the largest budget, with a cosine schedule whose
warm restarts end at the checkpoints F, 2F, 4F, … (F the floor budget, :func:`checkpoint_steps`); at each
checkpoint every head is scored on val and keeps its best state so far, so selection on val picks each method's
own budget along with its other hyperparameters.

Under ``search="halving"`` (successive halving, η = 3, :func:`halving_rungs`) every grid point starts in the stack; at
the rungs ⌈T/9⌉ and ⌈T/3⌉ of the stack's T steps each method's heads are ranked on val (the score of the grid
selection) and only the best ⌈n/3⌉, then ⌈n/9⌉ of its n grid points go on: the others stop, frozen in their state at
that step, and leave the stack — its parameters and optimiser state are compacted to the survivors, so every later
step multiplies only their weights. ``search="halving-restarts"`` also restarts the cosine schedule at each rung
(cycles ending at the rungs and at T), so the heads are ranked annealed rather than mid-cycle. Methods keep their own
per-head state at full size: the trainer hands them the survivors' logits at their positions (zeros for stopped heads)
and sums only the survivors' losses.

Features are tensors on the training device, or — when they do not fit the memory cap — a
:class:`~mr2probe.source.StreamedFeatures` read from the feature file: the trainer only slices them
(``x[i:j]``, in chunks) and draws training batches through :func:`epoch_batches`.
"""
from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Iterator

import numpy as np
import torch

from .distributed import local_device
from .errors import UserError
from .heads import HeadSet, ProbeConfig, ProbeStack
from .losses import LossTables, stack_loss, stack_loss_and_ce
from .methods import METHODS, Batch, FitContext, FitData, FitSchedule, HeadsView, Method, SharedStats
from .optim import StackedAdamW
from .progress import progress_bar
from .settings import TRAIN, check_all
from .source import StreamedFeatures

EVAL_CHUNK = 8192


@dataclass
class TrainConfig:
    """Training settings shared by all runs. Grid: lr × weight decay (× cosine scale for cosine heads), plus each
    method's own ``grid``.

    Budget: ``budget_steps`` = max(epochs · ⌈N / batch_size⌉, min_steps) optimiser steps, rounded up to whole
    epochs (:func:`budget`), the same for every head of a stack — so a small or few-shot training set still
    gets at least ``min_steps`` steps instead of a handful. Under ``budget_rule="checkpoints"`` that floor F is the
    first of the checkpoints F·2ⁱ ≤ ``max_steps`` (:func:`checkpoint_steps`), and each head keeps its best one on
    val."""

    # the defaults are the settings' (mr2probe.settings.TRAIN, declared once)
    epochs: int = TRAIN["epochs"].default
    batch_size: int = TRAIN["batch_size"].default
    lr: tuple[float, ...] = TRAIN["lr"].default  # learning-rate grid
    wd: tuple[float, ...] = TRAIN["wd"].default  # AdamW (decoupled) weight-decay grid
    min_steps: int = TRAIN["min_steps"].default  # floor of the budget in optimiser steps
    budget_rule: str = TRAIN["budget_rule"].default  # floor; reach-logreg: min_steps calibrated (experiment.py);
    # checkpoints: one run to the largest checkpoint, each head's best checkpoint on val (checkpoint_steps)
    max_steps: int = TRAIN["max_steps"].default  # ceiling of the reach-logreg calibration and of the checkpoints
    search: str = TRAIN["search"].default  # full: every grid point to the budget; halving: halving_rungs
    l2: tuple[float, ...] = TRAIN["l2"].default  # grid of a coupled L2 penalty ½·l2·‖W‖² on linear-head weights
    scale: tuple[float, ...] = TRAIN["scale"].default  # cosine-head scale grid, selected on val
    method_params: dict[str, dict[str, Any]] = field(default_factory=dict)  # fixed overrides per method
    method_grid: bool = TRAIN["method_grid"].default  # also search the methods' own grids
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    device: str | None = TRAIN["device"].default
    progress: bool = True
    # CPU only: the heads of a stack are trained in consecutive groups whose per-batch activations (logits [h, B, K]
    # and any adapter outputs, in the features' dtype; :func:`chunk_size`) take at most this many MiB (whole methods
    # where they fit; :func:`head_chunks`); 0 = one stack. On a GPU one wide product is best.
    chunk_mib: float = 16.0
    compile: str = TRAIN["compile"].default  # auto: torch.compile the step on a GPU (:func:`compiled_step`)
    cuda_graph: bool = TRAIN["cuda_graph"].default  # with compile on a GPU: the step as a CUDA graph
    tf32: bool = TRAIN["tf32"].default  # TF32 products on a GPU
    log: str = TRAIN["log"].default  # experiment tracker (mr2probe.tracking): how the run is shown, not trained

    @property
    def halving(self) -> bool:
        """Whether the search is a successive halving (``halving`` or ``halving-restarts``), not the full grid."""
        return self.search != "full"

    def check(self) -> None:
        """Every field that is a setting within what :data:`~mr2probe.settings.TRAIN` declares
        (:meth:`~mr2probe.settings.Setting.check`), the probe valid, and an L2 penalty only on a linear head; else
        one :class:`UserError`."""
        self.probe.check()
        check_all(TRAIN, {f.name: getattr(self, f.name) for f in fields(self)})
        if any(self.l2) and self.probe.head != "linear":
            raise UserError("--l2 penalises linear-head weights; a cosine head normalises them (use --wd)")


def budget(n: int, cfg: TrainConfig, epochs: int | None = None) -> tuple[int, int]:
    """(epochs, steps per epoch) for ``n`` training rows: epochs = max(cfg.epochs, ⌈min_steps / ⌈n / B⌉⌉), so the
    budget is at least ``min_steps`` optimiser steps (whole epochs: per-epoch method updates keep their meaning).
    An auxiliary stage given its own ``epochs`` (JTT's first stage, sized by the method from
    ``ctx.schedule.epochs``, which is already the floored count) trains exactly that many."""
    per_epoch = -(-n // cfg.batch_size)
    if epochs is not None:
        return epochs, per_epoch
    return max(cfg.epochs, -(-cfg.min_steps // per_epoch)), per_epoch


def checkpoint_steps(n: int, cfg: TrainConfig) -> list[int]:
    """The ``checkpoints`` rule's checkpoints for ``n`` training rows: F·2ⁱ ≤ ``max_steps``, i = 0, 1, …, with F the
    floor rule's budget (:func:`budget`; whole epochs, so every checkpoint ends an epoch). They are also the ends
    of the schedule's cosine cycles (lengths F, F, 2F, 4F, …; :mod:`mr2probe.optim`). A one-line UserError when
    ``max_steps`` < F."""
    epochs, per_epoch = budget(n, cfg)
    floor, ceiling = int(epochs * per_epoch), int(cfg.max_steps)
    if ceiling < floor:
        raise UserError(f"--max-steps {cfg.max_steps} is below the floor budget of {floor} steps, the first "
                        f"checkpoint of --budget-rule checkpoints (raise --max-steps or lower --epochs/--min-steps)")
    return [floor << i for i in range((ceiling // floor).bit_length())]


def train_steps(n: int, cfg: TrainConfig) -> int:
    """Optimiser steps a stack trains for ``n`` rows: the floor budget, or the last checkpoint under the
    ``checkpoints`` rule."""
    if cfg.budget_rule == "checkpoints":
        return checkpoint_steps(n, cfg)[-1]
    epochs, per_epoch = budget(n, cfg)
    return epochs * per_epoch


FINITE_EVERY = 64  # steps between host reads of "every loss so far was finite" (a read waits for the device)
HALVING_ETA = 3  # successive halving: each rung keeps a third of every method's heads


HALVING_RUNGS = 2  # rungs at T/η², T/η


def halving_rungs(steps: int, eta: int = HALVING_ETA, count: int = HALVING_RUNGS) -> list[tuple[int, int]]:
    """Successive halving's rungs for a stack of T = ``steps`` optimiser steps: (r_k, k), k = 1 … R (R = ``count``),
    r_k = ⌈T / η^(R+1−k)⌉ — T/9 then T/3 at η = 3 — only those before T (none for T = 1). At rung k each method
    keeps its ⌈n/η^k⌉ best heads on val (:func:`halving_survivors`); rungs that fall on one step cut there once,
    to the later rung's survivors."""
    rungs = [(-(-steps // eta ** (count + 1 - k)), k) for k in range(1, count + 1)]
    return [(r, k) for r, k in rungs if r < steps]


def halving_survivors(n: int, k: int, eta: int = HALVING_ETA) -> int:
    """⌈n / η^k⌉: the heads of a method with n grid points that train on after rung k (≥ 1 for n ≥ 1)."""
    return -(-n // eta**k)


def search_schedule(n: int, cfg: TrainConfig) -> dict[str, Any] | None:
    """results.json's ``budget.search`` for ``n`` training rows under a halving search (``halving``,
    ``halving-restarts``, its ``rule``): the rung steps, η and the survivors per method after each rung; None under
    ``full``."""
    if not cfg.halving:
        return None
    steps = train_steps(n, cfg)
    return {"rule": cfg.search, "eta": HALVING_ETA, "steps": steps,
            "rungs": [{"step": r, "keep": f"ceil(n/{HALVING_ETA ** k})"} for r, k in halving_rungs(steps)],
            "select": "among the heads that reach the budget"}


def select_scores(logits: torch.Tensor, y: torch.Tensor, k: int, select: str) -> np.ndarray:
    """Val score of every head: logits [H, n, K] → [H]; ``select`` "acc" = mean 1[argmax = y], "macc" = the mean
    over classes (with val samples) of the per-class accuracy."""
    correct = (logits.argmax(-1) == y).float()  # [H, n]
    if select == "acc":
        return correct.mean(1).cpu().numpy()
    onehot = torch.nn.functional.one_hot(y, k).float()  # [n, K]
    per_class = (correct @ onehot) / onehot.sum(0)  # NaN for a class without val samples: left out of the mean
    return np.nanmean(per_class.cpu().numpy(), axis=1)


@dataclass(frozen=True)
class RunSpec:
    """One head: a method with all its hyperparameters (lr and weight_decay included) and a seed."""

    method: str
    hparams: tuple[tuple[str, Any], ...]
    seed: int

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.hparams)


@dataclass
class TrainData:
    """Training and validation data: labels are tensors on the training device, features too or streamed."""

    x: torch.Tensor | StreamedFeatures
    y: torch.Tensor
    val_x: torch.Tensor | StreamedFeatures
    val_y: torch.Tensor
    num_classes: int
    # what depends on the frozen features alone (MR2's class statistics without an adapter): computed by the first
    # stack trained on this data and reused by every later one (the other seeds, chunks and auxiliary stages)
    shared: SharedStats = field(default_factory=SharedStats, repr=False, compare=False)


def method_hparams(method: str, cfg: TrainConfig) -> list[dict[str, Any]]:
    """Every grid point of a method: defaults ⊕ fixed overrides ⊕ (lr × wd × method grid)."""
    cls = METHODS.get(method)
    fixed = cfg.method_params.get(method, {})
    unknown = set(fixed) - set(cls.defaults)
    if unknown:
        raise UserError(f"method {method!r} has no hyperparameter {', '.join(sorted(unknown))}; it has: "
                        f"{', '.join(sorted(cls.defaults)) or 'none'}")
    grid = {"lr": list(cfg.lr), "weight_decay": list(cfg.wd)}
    if cfg.probe.head == "cosine":
        grid["scale"] = list(cfg.scale)
    if tuple(cfg.l2) != (0.0,):
        grid["l2"] = list(cfg.l2)
    if cfg.method_grid:
        grid.update({k: v for k, v in cls.grid.items() if k not in fixed})
        if cfg.probe.adapter != "none":  # grids that matter only with a trainable adapter (MR2's λ)
            grid.update({k: v for k, v in cls.adapter_grid.items() if k not in fixed})
    keys = list(grid)
    points = [{**cls.defaults, **fixed, **dict(zip(keys, values))} for values in itertools.product(*grid.values())]
    for hp in points:
        try:
            cls.check_types(hp)
            cls.check(hp)
        except TypeError:
            raise UserError(f"method {method!r}: a hyperparameter has the wrong type in {fixed}") from None
        except UserError as e:
            raise UserError(f"method {method!r}: {e} (--set {method}.PARAM=VALUE)") from None
    return points


def expand_runs(methods: list[str], seeds: list[int], cfg: TrainConfig) -> list[RunSpec]:
    return [RunSpec(m, tuple(sorted(hp.items())), s) for s in seeds for m in methods for hp in method_hparams(m, cfg)]


def pick_device(device: str | None) -> torch.device:
    """``device``, else this rank's GPU (``LOCAL_RANK`` under torchrun) when there is one, else the CPU."""
    return torch.device(device) if device else local_device()


def chunk_rows(x: torch.Tensor | StreamedFeatures) -> int:
    """Rows per evaluation chunk: EVAL_CHUNK, or less for streamed features (at most one block)."""
    return min(EVAL_CHUNK, x.block_rows) if isinstance(x, StreamedFeatures) else EVAL_CHUNK


def epoch_batches(x: torch.Tensor | StreamedFeatures, batch_size: int, gen: torch.Generator
                  ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch of (positions in the training set, features) batches, in an order fixed by ``gen``: a random
    permutation in memory (each batch valid until the next is drawn); for streamed features shuffled blocks
    (``StreamedFeatures.batches``). Both have ⌈N / batch_size⌉ batches."""
    if isinstance(x, StreamedFeatures):
        yield from x.batches(batch_size, gen)
        return
    order = torch.randperm(len(x), generator=gen).to(x.device)
    buf = x.new_empty(min(batch_size, len(x)), *x.shape[1:])
    for idx in order.split(batch_size):
        # into one buffer reused by every batch (a batch is consumed, backward included, before the next is drawn):
        # on a CPU a fresh [B, D] tensor per step costs more page faults than the gather itself
        yield idx, torch.index_select(x, 0, idx, out=buf[:len(idx)])


@dataclass
class TrainedStack:
    """The result of training one stack: its runs, the probe and each head's method info. Under the
    ``checkpoints`` rule also the checkpoint steps, every head's val score at each ([C, H]) and the step whose
    state the probe holds for each head (the first best; without checkpoints empty / None). Under successive
    halving also the rung steps and the step at which each head stopped (``stopped_at``: a rung, or the budget
    for the heads that reached it; its state is from then); a head stopped at a rung holds no checkpoint (None,
    and NaN scores from its rung on)."""

    specs: list[RunSpec]
    probe: ProbeStack
    info: list[dict[str, Any]]
    checkpoints: list[int] = field(default_factory=list)
    checkpoint_scores: np.ndarray | None = None  # [C, H] val scores
    checkpoint_step: list[int | None] | None = None  # [H] the checkpoint each head's state is from
    rungs: list[int] = field(default_factory=list)  # successive halving's rung steps
    stopped_at: list[int] | None = None  # [H] under successive halving: the step each head stopped at

    @property
    def finished(self) -> list[bool]:
        """[H] whether each head trained to the budget (all of them without successive halving)."""
        if self.stopped_at is None:
            return [True] * len(self.specs)
        last = max(self.stopped_at)
        return [s == last for s in self.stopped_at]

    @torch.no_grad()
    def predict(self, x: torch.Tensor | StreamedFeatures, heads: list[int] | None = None) -> torch.Tensor:
        """Logits [H, N, K] (or of the chosen heads), evaluated in chunks."""
        c = chunk_rows(x)
        outs = [self.probe(x[i:i + c])[1] for i in range(0, len(x), c)]
        logits = torch.cat(outs, dim=1)
        return logits if heads is None else logits[heads]


def head_chunks(specs: list[RunSpec], heads_per_chunk: int, whole: bool = False) -> list[list[RunSpec]]:
    """``specs`` (grouped by method) cut into consecutive chunks of at most ``heads_per_chunk`` heads, packing whole
    methods greedily (a method with more heads than that is cut into full chunks): a method's slice is split only
    when it alone exceeds a chunk, so its per-stack work (JTT's first stage, shared statistics) is not repeated.
    ``whole``: never split a method (one larger than a chunk is a chunk of its own), as successive halving ranks
    all of a method's heads together."""
    chunks: list[list[RunSpec]] = []
    for _, sl in _slices(specs):
        group = specs[sl]
        if chunks and len(chunks[-1]) + len(group) <= heads_per_chunk:
            chunks[-1].extend(group)
            continue
        step = len(group) if whole else max(heads_per_chunk, 1)
        chunks.extend(list(group[i:i + step]) for i in range(0, len(group), step))
    return chunks


def chunk_size(cfg: TrainConfig, num_classes: int, device: torch.device, itemsize: int = 4) -> int | None:
    """Heads per chunk on a CPU, None for one stack (a GPU, or ``chunk_mib`` 0): as many heads as keep their
    per-batch activations within ``cfg.chunk_mib``, i.e. B · (K + adapter widths) · ``itemsize`` bytes per head
    (logits [B, K]; a linear adapter adds z [B, d], an MLP its hidden layer too). Why: a CPU computes the loss ops
    of a stack whose logits exceed its cache at memory speed (at K = 1000 one 104-head stack trained slower than
    the same heads one by one). Streamed features are read once per chunk and epoch."""
    if device.type != "cpu" or cfg.chunk_mib <= 0:
        return None
    widths = {"none": 0, "linear": 1, "mlp": 2}.get(cfg.probe.adapter, 1) * cfg.probe.width
    per_head = cfg.batch_size * (num_classes + widths) * itemsize
    return max(1, int(cfg.chunk_mib * 2**20 // per_head))


def _slices(specs: list[RunSpec]) -> list[tuple[str, slice]]:
    """Contiguous (method, heads) slices of a stack whose specs are grouped by method."""
    out, start = [], 0
    for method, group in itertools.groupby(specs, key=lambda s: s.method):
        n = len(list(group))
        out.append((method, slice(start, start + n)))
        start += n
    return out


EpochHook = Callable[[int, dict[str, float]], None]
"""Called at the end of every epoch of a stack's main training with (epochs done, method → its best val score)."""


def _merged_epochs(on_epoch: EpochHook) -> tuple[EpochHook, Callable[[], None]]:
    """For a stack trained in chunks: a hook that collects each chunk's scores (a method's best over the chunks
    holding its heads), and a call that reports them epoch by epoch once every chunk is trained."""
    seen: dict[int, dict[str, float]] = {}

    def collect(epoch: int, scores: dict[str, float]) -> None:
        row = seen.setdefault(epoch, {})
        row.update({m: max(v, row.get(m, v)) for m, v in scores.items()})

    def report() -> None:
        for epoch in sorted(seen):
            on_epoch(epoch, seen[epoch])

    return collect, report


def train_stack(data: TrainData, specs: list[RunSpec], cfg: TrainConfig,
                log: Callable[[str], None] = lambda m: None, epochs: int | None = None,
                description: str = "train", bar: Any = None, select: str = "acc",
                on_epoch: EpochHook | None = None) -> TrainedStack:
    """Train the heads of ``specs`` (all with one seed) together; returns the trained stack. On a CPU the heads
    go through in chunks (:func:`chunk_size`), each chunk a stack of its own that shares the seed's batches and the
    statistics of frozen features; the result is one stack, the same heads in the same order. Under the
    ``checkpoints`` rule (and no ``epochs`` of an auxiliary stage) every head returns in its best state on val by
    the score ``select`` (:func:`select_scores`) over the checkpoints. Under ``search="halving"`` (no ``epochs``)
    each method's heads are cut at the rungs (:func:`halving_rungs`); chunks then hold whole methods. ``on_epoch``
    (:data:`EpochHook`): each method's best val score at every epoch's end (of a chunked stack: after the last
    chunk)."""
    if len({s.seed for s in specs}) != 1:
        raise ValueError("a stack trains runs of one seed")
    specs = sorted(specs, key=lambda s: s.method)  # stable: grid order kept inside a method
    size = chunk_size(cfg, data.num_classes, data.y.device, torch.empty(0, dtype=data.x.dtype).element_size())
    chunks = [specs] if size is None else head_chunks(specs, size, whole=cfg.halving and epochs is None)
    if len(chunks) == 1:
        with matmul_precision(cfg, data.y.device):
            return _train_stack(data, specs, cfg, log, epochs, description, bar, 1.0, select, on_epoch)
    collect, report = _merged_epochs(on_epoch) if on_epoch is not None else (None, lambda: None)
    total = train_steps(len(data.y), cfg) if epochs is None else int(np.prod(budget(len(data.y), cfg, epochs)))
    own = progress_bar(f"{description}: {len(specs)} heads in {len(chunks)} chunks", total=total,
                       enabled=cfg.progress and bar is None)
    with own if bar is None else contextlib.nullcontext(bar) as bar:
        # each chunk runs the seed's epochs again: the bar names the chunk so its epoch counter reads right
        parts = [_train_stack(data, c, cfg, log, epochs, f"{description} · chunk {i + 1}/{len(chunks)}", bar,
                              len(c) / len(specs), select, collect) for i, c in enumerate(chunks)]
    report()
    ckpt = parts[0].checkpoint_scores is not None
    halved = parts[0].stopped_at is not None
    return TrainedStack(specs=[s for p in parts for s in p.specs], probe=ProbeStack.concat([p.probe for p in parts]),
                        info=[i for p in parts for i in p.info], checkpoints=parts[0].checkpoints,
                        checkpoint_scores=np.concatenate([p.checkpoint_scores for p in parts], 1) if ckpt else None,
                        checkpoint_step=[c for p in parts for c in p.checkpoint_step] if ckpt else None,
                        rungs=parts[0].rungs, stopped_at=[t for p in parts for t in p.stopped_at] if halved else None)


@dataclass
class _View:
    """Where a method's ``h`` heads are while a stack trains: ``g`` their slice of the stack as built (fixed), ``sl``
    their slice of it now (heads leave it under successive halving, :class:`_Halving`), ``local`` the positions of
    the heads still in it among the method's own h (None: all of them, in order). ``rows``: which of the heads
    built in ``g`` the method instance's h heads are (in order; None: all of them): a method rebuilt for the
    survivors of a cut (:meth:`~mr2probe.methods.Method.stateless`) holds only those."""

    g: slice
    h: int
    sl: slice
    local: torch.Tensor | None = None
    rows: list[int] | None = None

    def positions(self) -> list[int]:
        """The stack-as-built positions of the method instance's h heads (the rows of its ``info()``)."""
        return [self.g.start + j for j in (self.rows if self.rows is not None else range(self.h))]

    def full(self, t: torch.Tensor) -> torch.Tensor:
        """Per-head rows of the live heads [h', …] as the method's h rows: zeros at stopped heads (``index_copy``,
        differentiable in ``t``); ``t`` itself while every head is live."""
        if self.local is None:
            return t
        return t.new_zeros((self.h, *t.shape[1:])).index_copy(0, self.local, t)

    def full_rep(self, t: torch.Tensor) -> torch.Tensor:
        """A representation [h'|1, …]: one row (shared by all heads, or the one live head's: broadcast, it reaches
        that head) as it is, else :meth:`full`."""
        return t if t.shape[0] == 1 else self.full(t)

    def live(self, loss: torch.Tensor) -> torch.Tensor:
        """The live heads' entries [h'] of a per-head loss [h]."""
        return loss if self.local is None else loss.index_select(0, self.local)


class StackStep:
    """One training step's loss for a stack: the probe's forward, every head's loss in one pass of the loss form
    (:mod:`mr2probe.losses`) over the live heads' logits and the methods' auxiliary heads, the methods' per-step hooks
    and extra terms. The rows of the pass: the live heads of the stack in order, then each method's auxiliary heads
    (all h of them: the method's own parameters keep their shape; only the live ones' losses count)."""

    def __init__(self, probe: ProbeStack, methods: list[tuple[Method, "_View"]], num_classes: int,
                 detach: torch.Tensor | None, l2: torch.Tensor | None) -> None:
        self.probe, self.methods, self.num_classes, self.detach, self.l2 = probe, methods, num_classes, detach, l2
        self.rebuild_tables()

    def rebuild_tables(self) -> None:
        """The loss tables of the stack as it is now (after set-up, and after each cut of successive halving): one
        for the live heads, one for the methods' auxiliary heads (all h of each such method, in method order)."""
        x = next(iter(self.probe.state_dict().values()))
        self.aux: list[tuple[Method, "_View", slice]] = []
        start = 0
        for m, v in self.methods:
            if type(m).aux_logits is not Method.aux_logits:
                self.aux.append((m, v, slice(start, start + m.h)))
                start += m.h
        self.tables = LossTables(self.probe.num_heads, self.num_classes, x.device, x.dtype)
        self.aux_tables = LossTables(start, self.num_classes, x.device, x.dtype) if self.aux else None
        for m, v in self.methods:
            self.write_terms(m, v)
        self.uses_rep = [type(m).reweights or type(m).aux_logits is not Method.aux_logits
                         or type(m).extra_loss is not Method.extra_loss or type(m).before_step is not Method.before_step
                         for m, _ in self.methods]

    def write_terms(self, m: Method, v: "_View") -> None:
        """Method ``m``'s declared terms into its rows (after ``prepare`` and each ``on_epoch_start``)."""
        self.tables.write(v.sl, m.terms(), v.local)
        for mm, _, rows in self.aux:
            if mm is m:
                self.aux_tables.write(rows, m.aux_terms())

    def __call__(self, xb: torch.Tensor, yb: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """The stack's training loss on one batch: Σ over live heads of their per-head losses. The auxiliary heads
        (LfF's biased heads) go first, in a pass of their own, so the hooks of the main pass can read their c."""
        rep, logits = self.probe(xb, self.detach)
        sizes = [v.sl.stop - v.sl.start for _, v in self.methods]
        reps = rep.split(sizes) if rep.shape[0] > 1 else [rep] * len(self.methods)
        batches = {id(m): Batch(None, v.full_rep(r), yb, idx)
                   for (m, v), r, used in zip(self.methods, reps, self.uses_rep) if used}
        for m, v in self.methods:
            if type(m).before_step is not Method.before_step:
                m.before_step(batches[id(m)])
                if m.per_step_terms:
                    self.tables.write(v.sl, m.terms(), v.local)
        loss, c_aux = None, None
        if self.aux:
            z_aux = torch.cat([m.aux_logits(batches[id(m)]) for m, _, _ in self.aux])
            per_aux, c_aux = stack_loss_and_ce(z_aux, yb, self.aux_tables)
            loss = sum(v.live(per_aux[rows]).sum() for _, v, rows in self.aux)
        hooks = [(v.sl, self._hook(m, v, batches[id(m)], c_aux)) for m, v in self.methods if type(m).reweights]
        main = stack_loss(logits, yb, self.tables, hooks).sum()
        loss = main if loss is None else main + loss
        for m, v in self.methods:
            if type(m).extra_loss is not Method.extra_loss:
                extra = m.extra_loss(batches[id(m)])
                if extra is not None:
                    loss = loss + v.live(extra).sum()
        if self.l2 is not None:  # ½·l2_h·‖W_h‖² per head: the objective of L2 logistic regression, mean-CE form
            loss = loss + 0.5 * (self.l2 * self.probe.head_W.pow(2).sum((1, 2))).sum()
        return loss

    def _hook(self, m: Method, v: "_View", batch: Batch, c_aux: torch.Tensor | None
              ) -> Callable[[torch.Tensor], torch.Tensor]:
        """The per-step weights of method ``m``'s live rows from every row's c [H, B]."""
        rows = next((rows for mm, _, rows in self.aux if mm is m), None)

        def weights(c: torch.Tensor) -> torch.Tensor:
            own_aux = None if rows is None or c_aux is None else c_aux[rows]
            return v.live(m.sample_weights(v.full(c[v.sl]), batch, own_aux))

        return weights

    def select(self, keep: torch.Tensor) -> None:
        """Successive halving's cut: the per-head tensors of the step keep the rows ``keep``; tables are rebuilt."""
        self.l2 = None if self.l2 is None else self.l2.index_select(0, keep)
        self.detach = None if self.detach is None else self.detach.index_select(0, keep)
        self.rebuild_tables()

    def train_step(self, opt: StackedAdamW, xb: torch.Tensor, yb: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """One optimiser step on a batch (forward, losses, backward, AdamW); returns the loss, detached."""
        loss = self(xb, yb, idx)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()

    def state_tensors(self, opt: StackedAdamW) -> list[torch.Tensor]:
        """Every tensor a step reads or updates in place besides the batch: the probe's, the tables', the
        optimiser's and the methods' (what a CUDA graph must find at the same address on every replay)."""
        found = [*self.probe.parameters(), *self.probe.buffers(), opt.t, opt.count, opt.schedule,
                 *(t for moments in opt.state.values() for t in moments)]
        for tables in (self.tables, self.aux_tables):
            if tables is not None:
                found += [tables.at_label, tables.offset, tables.per_head, tables.dropped]
        for m, _ in self.methods:
            found += [t for t in vars(m).values() if isinstance(t, torch.Tensor)]
            found += [t for d in vars(m).values() if isinstance(d, dict) for t in d.values()
                      if isinstance(t, torch.Tensor)]
        return found


COMPILE_ERRORS = (torch._dynamo.exc.BackendCompilerFailed, torch._dynamo.exc.Unsupported,
                  torch._dynamo.exc.InternalTorchDynamoError)  # raised while compiling, before the step runs


def compile_on(cfg: TrainConfig, device: torch.device) -> bool:
    """Whether the step is compiled: ``compile`` on, or auto on a GPU."""
    return cfg.compile == "on" or (cfg.compile == "auto" and device.type == "cuda")


def step_runner(step: StackStep, opt: StackedAdamW, cfg: TrainConfig, device: torch.device,
                log: Callable[[str], None] = lambda m: None
                ) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """The training step to call per batch, (features, labels, positions) → loss: eager, or (:func:`compile_on`)
    the whole step compiled with ``torch.compile(fullgraph=True)``, and on a GPU with ``cuda_graph`` captured as CUDA
    graphs and replayed (torch.compile's reduce-overhead mode, the step's state marked as static addresses).
    Shapes are static: the last, smaller batch of an epoch and each halving cut compile once more. Where the compiler
    fails on a graph (compilation happens before the step runs: nothing has moved), the stack says so once in the log
    and goes on eagerly."""
    def eager(xb: torch.Tensor, yb: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return step.train_step(opt, xb, yb, idx)

    if not compile_on(cfg, device):
        return eager
    graphs = cfg.cuda_graph and device.type == "cuda"
    compiled = torch.compile(eager, fullgraph=True, dynamic=False, mode="reduce-overhead" if graphs else None)
    marked: list[int] = []

    def run(xb: torch.Tensor, yb: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        if graphs and marked != [id(step.tables)]:  # after set-up and after each cut: the step's new state
            for t in step.state_tensors(opt):
                torch._dynamo.mark_static_address(t)
            marked[:] = [id(step.tables)]
        if failed:
            return eager(xb, yb, idx)
        # every stack (seed, chunk, auxiliary stage) is a graph of its own for the one step function: no limit on them
        try:
            with torch._dynamo.config.patch(trace_autograd_ops=True, recompile_limit=1 << 16,
                                            accumulated_recompile_limit=1 << 16):
                return compiled(xb, yb, idx)
        except COMPILE_ERRORS as e:
            failed.append(e)
            log(f"the compiler failed on this stack's step ({type(e).__name__}: {str(e).splitlines()[0][:160]}); "
                "it trains eagerly (--compile off skips compiling)")
            return eager(xb, yb, idx)

    failed: list[Exception] = []
    return run


@contextlib.contextmanager
def matmul_precision(cfg: TrainConfig, device: torch.device) -> Iterator[None]:
    """On a GPU, TF32 products for float32 (``tf32``) or strict FP32, for the duration; a CPU is left as it is."""
    if device.type != "cuda":
        yield
        return
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if cfg.tf32 else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def make_context(data: TrainData, probe: ProbeStack, cfg: TrainConfig, v: "_View", seed: int, epochs: int,
                 log: Callable[[str], None], description: str, quiet: bool = False) -> FitContext:
    """What a method on the heads of ``v`` may use (:class:`~mr2probe.methods.FitContext`): the data, read-only
    no-grad passes over its own heads, the schedule, the statistics shared on this data and the auxiliary stages
    (:class:`AuxiliaryStages`)."""
    n = len(data.y)

    def represent_train() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        c = chunk_rows(data.x)
        with torch.no_grad():
            for i in range(0, n, c):
                z = probe.represent(data.x[i:i + c], v.sl)
                yield (z if z.shape[0] == 1 else v.full(z)), data.y[i:i + c]

    def predict(x: torch.Tensor | StreamedFeatures) -> torch.Tensor:
        c = chunk_rows(x)
        with torch.no_grad():
            return v.full(torch.cat([probe.logits(x[i:i + c], v.sl) for i in range(0, len(x), c)], 1))

    def represent_input_train() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        c = chunk_rows(data.x)
        with torch.no_grad():
            for i in range(0, n, c):
                yield v.full_rep(probe.adapter_output(data.x[i:i + c], v.sl)), data.y[i:i + c]

    def represent_input(idx: torch.Tensor) -> torch.Tensor:
        return v.full_rep(probe.adapter_output(data.x[idx], v.sl))

    heads = HeadsView(config=cfg.probe, rep_dim=probe.out_dim, represent_train=represent_train, predict=predict,
                      represent_input_train=represent_input_train, represent_input=represent_input)
    return FitContext(data=FitData(data.x, data.y, data.val_x, data.val_y, data.num_classes), heads=heads,
                      schedule=FitSchedule(epochs=epochs, batch_size=cfg.batch_size, seed=seed),
                      aux=AuxiliaryStages(data, cfg, seed, probe.out_dim, log, description), shared=data.shared,
                      log=(lambda msg: None) if quiet else log)


def train_auxiliary(data: TrainData, cfg: TrainConfig, method: str, hparams: list[dict[str, Any]], seed: int,
                    epochs: int, log: Callable[[str], None] = lambda m: None, description: str = "train"
                    ) -> torch.Tensor:
    """An auxiliary training stage (JTT's first stage): a stack of one head of ``method`` per ``hparams`` (lr and
    weight_decay included), with ``seed``, on ``data`` and ``cfg``'s probe, trained for exactly ``epochs`` (no
    checkpoints, no halving); returns their logits on the training set, [len(hparams), N, K]."""
    specs = [RunSpec(method, tuple(sorted(hp.items())), seed) for hp in hparams]
    trained = train_stack(data, specs, cfg, log, epochs=epochs, description=f"{description} (stage 1)")
    return trained.predict(data.x)


@dataclass(frozen=True)
class AuxiliaryStages:
    """``FitContext.aux`` of a stack's methods (the :class:`~mr2probe.methods.Auxiliary` protocol): auxiliary
    stages (:func:`train_auxiliary`) on the stack's data and seed, and fresh heads of its probe's kind on its
    representation (width ``rep_dim``)."""

    data: TrainData
    cfg: TrainConfig
    seed: int
    rep_dim: int
    log: Callable[[str], None]
    description: str

    def train(self, method: str, hparams: list[dict[str, Any]], epochs: int) -> torch.Tensor:
        return train_auxiliary(self.data, self.cfg, method, hparams, self.seed, epochs, self.log, self.description)

    def new_heads(self, seeds: list[int], scales: list[float]) -> HeadSet:
        return HeadSet.fresh(self.cfg.probe, seeds, self.data.num_classes, self.rep_dim, scales,
                             self.data.x.device, self.data.x.dtype)



def build_methods(data: TrainData, specs: list[RunSpec], cfg: TrainConfig, probe: ProbeStack, epochs: int,
                  log: Callable[[str], None], description: str = "train") -> list[tuple[Method, "_View"]]:
    """One prepared method instance per method slice of ``specs`` (sorted by method, one seed) on ``probe``."""
    methods: list[tuple[Method, _View]] = []
    for name, sl in _slices(specs):
        cls = METHODS.get(name)
        if cls.needs_adapter and cfg.probe.adapter == "none":
            raise UserError(f"method {name!r} needs a trainable adapter: pass --adapter linear or mlp")
        view = _View(g=sl, h=sl.stop - sl.start, sl=sl)
        m = cls([s.params for s in specs[sl]], make_context(data, probe, cfg, view, specs[0].seed, epochs, log,
                                                            description))
        methods.append((m, view))
    for m, _ in methods:
        m.prepare()
    return methods


@dataclass
class _Schedule:
    """A stack's step budget: ``epochs`` as the methods see it (the floor's; JTT's first stage, LDAM's deferral),
    the epochs and steps it trains, the checkpoints (``checkpoints`` rule) and the halving rungs."""

    epochs: int
    steps_per_epoch: int
    train_epochs: int
    checkpoints: list[int]
    rungs: list[tuple[int, int]]

    @property
    def total(self) -> int:
        return self.train_epochs * self.steps_per_epoch

    @classmethod
    def of(cls, n: int, cfg: TrainConfig, epochs: int | None) -> "_Schedule":
        main = epochs is None  # the sweep itself, not an auxiliary stage
        checkpoints = checkpoint_steps(n, cfg) if cfg.budget_rule == "checkpoints" and main else []
        epochs, per_epoch = budget(n, cfg, epochs)
        train_epochs = checkpoints[-1] // per_epoch if checkpoints else epochs
        rungs = halving_rungs(train_epochs * per_epoch) if cfg.halving and main else []
        return cls(epochs, per_epoch, train_epochs, checkpoints, rungs)

    def cycle_ends(self, cfg: TrainConfig) -> list[int]:
        """The cosine schedule's cycle ends: the checkpoints, or the rungs (halving-restarts: every head is ranked
        annealed) and the budget, or the budget alone."""
        if self.checkpoints:
            return self.checkpoints
        restarts = [r for r, _ in self.rungs] if cfg.search == "halving-restarts" else []
        return sorted(set(restarts)) + [self.epochs * self.steps_per_epoch]


class StackTraining:
    """One stack's training, in named phases: :meth:`set_up` (the probe, the methods, the optimiser, the step),
    :meth:`start_epoch`, :meth:`step` (one batch), :meth:`end_epoch` (divergence check, checkpoint, rung) and
    :meth:`finish` (the trained stack: as trained, in each head's best checkpoint, or as cut by halving)."""

    def __init__(self, data: TrainData, specs: list[RunSpec], cfg: TrainConfig, log: Callable[[str], None],
                 epochs: int | None, description: str, select: str) -> None:
        self.data, self.specs, self.cfg, self.log, self.description, self.select = (data, specs, cfg, log,
                                                                                    description, select)
        self.seed = specs[0].seed
        self.schedule = _Schedule.of(len(data.y), cfg, epochs)
        self.step_count, self.epoch = 0, 0
        self.set_up()

    def set_up(self) -> None:
        data, specs, cfg, dev = self.data, self.specs, self.cfg, self.data.x.device
        self.probe = ProbeStack(cfg.probe, data.x.shape[1], data.num_classes, [s.seed for s in specs],
                                [s.params.get("scale", cfg.probe.scale) for s in specs], device=dev).to(
            device=dev, dtype=data.x.dtype)
        self.methods = build_methods(data, specs, cfg, self.probe, self.schedule.epochs, self.log, self.description)
        lr, wd = (torch.tensor([s.params[k] for s in specs], dtype=data.x.dtype, device=dev)
                  for k in ("lr", "weight_decay"))
        groups = [(list(self.probe.parameters()), lr, wd)]
        groups += [(m.extra_parameters(), lr[v.g], wd[v.g]) for m, v in self.methods]
        self.opt = StackedAdamW(groups, cycle_ends=self.schedule.cycle_ends(cfg))
        l2 = torch.tensor([s.params.get("l2", 0.0) for s in specs], dtype=data.x.dtype, device=dev)
        detach = torch.tensor([type(m).detach_head_input for m, v in self.methods for _ in range(v.h)], device=dev)
        self.step_loss = StackStep(self.probe, self.methods, data.num_classes,
                                   detach if any(type(m).detach_head_input for m, _ in self.methods) else None,
                                   l2 if any(s.params.get("l2", 0.0) for s in specs) else None)
        self.train_step = step_runner(self.step_loss, self.opt, cfg, dev, self.log)
        self.gen = torch.Generator(device="cpu").manual_seed(self.seed)
        self.info: list[dict[str, Any]] = [{} for _ in specs]
        self.keeper = _BestState(self.probe, data, self.select, self.methods, self.info) \
            if self.schedule.checkpoints else None
        self.halving = _Halving(self.probe, self.opt, data, self.select, self.methods, self.info, self.schedule.rungs,
                                self.schedule.total, self.keeper, self.rebuild) if self.schedule.rungs else None
        self.finite = torch.ones((), dtype=torch.bool, device=dev)

    def rebuild(self, m: Method, hparams: list[dict[str, Any]], v: _View) -> Method:
        """A stateless method built again for the heads ``hparams`` (its view already re-pointed to them):
        prepared and brought to the current epoch, it computes their loss as ``m`` did."""
        fresh = type(m)(hparams, make_context(self.data, self.probe, self.cfg, v, self.seed, self.schedule.epochs,
                                              self.log, self.description, quiet=True))
        fresh.prepare()
        fresh.on_epoch_start(self.epoch)
        return fresh

    def start_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        for m, v in self.methods:
            m.on_epoch_start(epoch)
            self.step_loss.write_terms(m, v)

    def step(self, idx: torch.Tensor, xb: torch.Tensor) -> None:
        """One optimiser step; the divergence flag is read every FINITE_EVERY steps (no sync per step); a rung that
        falls inside an epoch cuts here."""
        loss = self.train_step(xb, self.data.y.index_select(0, idx), idx)
        self.finite = self.finite & torch.isfinite(loss)
        if self.step_count % FINITE_EVERY == FINITE_EVERY - 1:
            self.check_finite()
        self.step_count += 1
        if self.halving is not None and self.step_count % self.schedule.steps_per_epoch and \
                self.halving.due(self.step_count):
            self.check_finite()
            self.cut()

    def end_epoch(self) -> None:
        """Divergence check; the checkpoint ending this epoch; a rung at the epoch's end (after its checkpoint)."""
        self.check_finite()
        done = (self.epoch + 1) * self.schedule.steps_per_epoch
        if self.keeper is not None and done in self.schedule.checkpoints:
            self.keeper.checkpoint(done)
        if self.halving is not None and self.halving.due(self.step_count):
            self.cut()

    @torch.no_grad()
    def method_scores(self) -> dict[str, float]:
        """Each method's best val score (:func:`select_scores` by ``select``) over its heads still in the stack: one
        pass over val and one host sync (at an epoch's end, for :data:`EpochHook`)."""
        x, c = self.data.val_x, chunk_rows(self.data.val_x)
        logits = torch.cat([self.probe(x[i:i + c])[1] for i in range(0, len(x), c)], 1)
        scores = select_scores(logits, self.data.val_y, self.data.num_classes, self.select)
        return {m.name: float(np.max(scores[v.sl])) for m, v in self.methods}

    def check_finite(self) -> None:
        """Raise if any loss since the start was not finite (one host sync)."""
        if not bool(self.finite):
            raise UserError(f"training diverged (a non-finite loss by epoch {self.epoch + 1}); lower --lr")

    def cut(self) -> None:
        """Successive halving's cut at this step: the stack and the per-head tensors of the step shrink."""
        keep = self.halving.cut(self.step_count)
        if keep is not None:
            self.step_loss.select(keep)

    def finish(self) -> TrainedStack:
        self.opt.zero_grad()
        if self.halving is not None:
            return self.halving.result(self.specs, self.schedule.checkpoints)
        if self.keeper is not None:
            return self.keeper.restore(self.specs, self.schedule.checkpoints)
        for m, v in self.methods:
            for i, extra in zip(range(v.g.start, v.g.stop), m.info()):
                self.info[i] = extra
        return TrainedStack(specs=self.specs, probe=self.probe, info=self.info)


def _train_stack(data: TrainData, specs: list[RunSpec], cfg: TrainConfig, log: Callable[[str], None],
                 epochs: int | None, description: str, bar: Any, weight: float, select: str = "acc",
                 on_epoch: EpochHook | None = None) -> TrainedStack:
    """One stack: every head of ``specs`` (sorted by method, one seed) in one product per step; ``bar`` advances by
    ``weight`` per step (the stack's share of its seed's heads).

    Checkpoints (``checkpoints`` rule, no ``epochs`` given): training runs to the last checkpoint; at each
    checkpoint c the val scores s_c [H] are taken and, per head, best ← c where s_c > s_best (strictly: the
    earliest checkpoint on ties), the head's parameters copied with one ``torch.where`` per tensor. The methods
    see ``ctx.schedule.epochs`` = the floor's epochs (JTT's stage 1, LDAM's deferral epoch), so the first checkpoint
    is the floor rule's model.

    Successive halving (``search="halving"``, no ``epochs`` given): after the step of each rung (after the
    checkpoint where both fall on one step) the stack is cut to each method's best heads on val (:class:`_Halving`)."""
    run = StackTraining(data, specs, cfg, log, epochs, description, select)
    sched = run.schedule
    own = progress_bar(f"{description} seed {run.seed}: {len(specs)} heads", total=sched.total,
                       enabled=cfg.progress and bar is None)
    with own if bar is None else contextlib.nullcontext(bar) as bar:
        for epoch in range(sched.train_epochs):
            bar.update(description=f"{description} · seed {run.seed} · {run.probe.num_heads} heads · epoch "
                                   f"{epoch + 1}/{sched.train_epochs}")
            run.start_epoch(epoch)
            for idx, xb in epoch_batches(data.x, cfg.batch_size, run.gen):
                run.step(idx, xb)
                bar.advance(weight)
            run.end_epoch()
            if on_epoch is not None:
                on_epoch(epoch + 1, run.method_scores())
    return run.finish()


class _BestState:
    """Each head's best state over the checkpoints: its val score s_c = :func:`select_scores` at every checkpoint,
    and the parameters and method info of the first checkpoint with the highest score. ``alive``: the positions of
    the heads still in the (compacted) stack under successive halving, None while it holds every head."""

    def __init__(self, probe: ProbeStack, data: TrainData, select: str,
                 methods: list[tuple[Method, _View]], info: list[dict[str, Any]]) -> None:
        self.probe, self.data, self.select, self.methods, self.info = probe, data, select, methods, info
        h = probe.num_heads
        self.best = torch.full((h,), -float("inf"), dtype=torch.float64)
        self.step = torch.zeros(h, dtype=torch.long)
        self.state = {k: v.detach().clone() for k, v in probe.state_dict().items()}
        self.scores: list[np.ndarray] = []
        self.alive: torch.Tensor | None = None

    @torch.no_grad()
    def checkpoint(self, step: int) -> None:
        """Score every live head on val; heads that beat their best (strictly) take the current state and info
        (stopped heads score NaN: never better)."""
        x, c = self.data.val_x, chunk_rows(self.data.val_x)
        logits = torch.cat([self.probe(x[i:i + c])[1] for i in range(0, len(x), c)], 1)
        scores = select_scores(logits, self.data.val_y, self.data.num_classes, self.select)
        if self.alive is not None:
            every = np.full(len(self.best), np.nan)
            every[self.alive.cpu().numpy()] = scores
            scores = every
        self.scores.append(scores)
        better = torch.as_tensor(scores, dtype=torch.float64) > self.best
        self.best = torch.where(better, torch.as_tensor(scores, dtype=torch.float64), self.best)
        self.step = torch.where(better, torch.full_like(self.step, step), self.step)
        on = better.to(next(iter(self.state.values())).device)
        for k, v in self.probe.state_dict().items():
            if self.alive is None:
                self.state[k] = torch.where(on.reshape((-1,) + (1,) * (v.ndim - 1)), v.detach(), self.state[k])
            else:
                live = on.index_select(0, self.alive).reshape((-1,) + (1,) * (v.ndim - 1))
                kept = self.state[k].index_select(0, self.alive)
                self.state[k].index_copy_(0, self.alive, torch.where(live, v.detach(), kept))
        flags = better.tolist()
        for m, view in self.methods:  # method info (margins, class weights, …) as it was at each head's best checkpoint
            if any(flags[view.g]):
                for i, extra in zip(view.positions(), m.info()):
                    self.info[i] = extra if flags[i] else self.info[i]

    def restore(self, specs: list[RunSpec], checkpoints: list[int]) -> TrainedStack:
        """The stack with every head in its best state."""
        if self.alive is None:
            self.probe.load_state_dict(self.state)
            probe = self.probe
        else:  # the stack was compacted: a new one of every head
            probe = ProbeStack(self.probe.cfg, self.probe.in_dim, self.probe.num_classes, [0] * len(specs),
                               state=self.state)
        return TrainedStack(specs=specs, probe=probe, info=self.info, checkpoints=list(checkpoints),
                            checkpoint_scores=np.stack(self.scores), checkpoint_step=self.step.tolist())


class _Halving:
    """Successive halving over each method's grid in one stack (η = :data:`HALVING_ETA`).

    At rung k (step r_k, :func:`halving_rungs`) the live heads are scored on val (:func:`select_scores`, the grid
    selection's score) and ranked within their method (higher score first, the earlier grid point on ties); a
    method of n grid points keeps its ⌈n/η^k⌉ best (:func:`halving_survivors`), the same rungs for every method.
    A stopped head's parameters and method info are kept as they are at its rung (in ``final``, or in the
    checkpoint keeper's state, which they override), its ``stopped_at`` is the rung. Then the stack is compacted
    to the survivors, vectorised: every parameter and buffer p ← p[keep] (one ``index_select`` each), the
    optimiser's state likewise (:meth:`~mr2probe.optim.StackedAdamW.select_heads`), the methods' views
    re-pointed; method-owned parameters (LfF's biased head) keep their shape and stop
    (:meth:`~mr2probe.optim.StackedAdamW.freeze_heads`)."""

    def __init__(self, probe: ProbeStack, opt: StackedAdamW, data: TrainData, select: str,
                 methods: list[tuple[Method, _View]], info: list[dict[str, Any]], rungs: list[tuple[int, int]],
                 total: int, keeper: _BestState | None,
                 rebuild: Callable[[Method, list[dict[str, Any]], _View], Method]) -> None:
        self.probe, self.opt, self.data, self.select, self.methods, self.info = probe, opt, data, select, methods, info
        self.rebuild = rebuild  # (method, the survivors' hyperparameters, its view) → the method for them alone
        self.rungs, self.total, self.keeper = rungs, total, keeper
        h = probe.num_heads
        self.device = next(iter(probe.state_dict().values())).device
        self.alive = torch.arange(h, device=self.device)  # stack position → position in the stack as built
        self.method = np.repeat(np.arange(len(methods)), [v.h for _, v in methods])  # method of each live head
        self.n = np.array([v.h for _, v in methods])  # grid points per method
        self.stopped = np.full(h, total, dtype=np.int64)
        self.final = keeper.state if keeper is not None else None  # every head's state to return
        self.compacted = False

    def due(self, step: int) -> bool:
        return any(r == step for r, _ in self.rungs)

    @torch.no_grad()
    def cut(self, step: int) -> torch.Tensor | None:
        """The cut of the rung(s) at ``step``; returns the stack positions kept ([h'], for the caller's per-head
        tensors), None when every head goes on (each method has few enough)."""
        k = max(kk for r, kk in self.rungs if r == step)
        x, c = self.data.val_x, chunk_rows(self.data.val_x)
        logits = torch.cat([self.probe(x[i:i + c])[1] for i in range(0, len(x), c)], 1)
        scores = select_scores(logits, self.data.val_y, self.data.num_classes, self.select)
        s = np.where(np.isnan(scores), -np.inf, scores)
        h = len(s)
        order = np.lexsort((np.arange(h), -s, self.method))  # by method, then score descending, then grid order
        first = np.searchsorted(self.method, self.method)  # where each head's method starts (heads grouped)
        rank = np.empty(h, dtype=np.int64)
        rank[order] = np.arange(h) - first[order]
        keep = rank < halving_survivors(self.n, k)[self.method]  # ⌈n/η^k⌉ per method
        if keep.all():
            return None
        kept = torch.as_tensor(np.flatnonzero(keep), device=self.device)
        dropped = torch.as_tensor(np.flatnonzero(~keep), device=self.device)
        gone = self.alive.index_select(0, dropped)  # their positions in the stack as built
        gone_np = gone.cpu().numpy()
        self.stopped[gone_np] = step
        state = self.probe.state_dict()
        if self.final is None:
            self.final = {k: torch.empty((len(self.stopped), *v.shape[1:]), dtype=v.dtype, device=v.device)
                          for k, v in state.items()}
        for k, v in state.items():  # stopped heads: frozen as they are now
            self.final[k].index_copy_(0, gone, v.index_select(0, dropped))
        gone_set = set(gone_np.tolist())
        for m, view in self.methods:  # and their method info (JSON per head) from now
            if gone_set.intersection(view.positions()):
                for i, extra in zip(view.positions(), m.info()):
                    self.info[i] = extra if i in gone_set else self.info[i]
        old = list(self.probe.parameters())
        for name, t in list(self.probe.named_parameters()):  # new leaves: autograd keeps a leaf's shape
            self.probe.register_parameter(name, torch.nn.Parameter(t.detach().index_select(0, kept), t.requires_grad))
        for name, t in list(self.probe.named_buffers()):
            self.probe.register_buffer(name, t.index_select(0, kept))
        self.probe.num_heads = len(kept)
        self.opt.select_heads(old, kept, list(self.probe.parameters()))
        self.alive = self.alive.index_select(0, kept)
        self.method = self.method[keep]
        alive_np = self.alive.cpu().numpy()
        ends = np.cumsum(np.bincount(self.method, minlength=len(self.methods)))
        for i, ((m, view), end, count) in enumerate(zip(self.methods, ends,
                                                        np.bincount(self.method, minlength=len(self.methods)))):
            view.sl = slice(int(end - count), int(end))
            own = view.rows if view.rows is not None else list(range(view.h))
            local = [own.index(j) for j in (alive_np[view.sl] - view.g.start).tolist()]  # among the instance's h
            if len(local) == view.h:
                continue
            if m.stateless():  # a method for the survivors alone: its loss no longer pays for the stopped heads
                view.rows, view.h, view.local = [own[j] for j in local], len(local), None
                self.methods[i] = (self.rebuild(m, [m.hparams[j] for j in local], view), view)
                continue
            view.local = torch.as_tensor(local, device=self.device)
            stopped = torch.ones(view.h, dtype=torch.bool)
            stopped[torch.as_tensor(local)] = False
            self.opt.freeze_heads(m.extra_parameters(), stopped)
        if self.keeper is not None:
            self.keeper.alive = self.alive
        self.compacted = True
        return kept

    def result(self, specs: list[RunSpec], checkpoints: list[int]) -> TrainedStack:
        """The stack of every head: survivors as trained (or in their best checkpoint's state), stopped heads as
        at their rung; ``stopped_at`` per head, and no checkpoint (None) for a stopped head."""
        alive_np = self.alive.cpu().numpy()
        if self.keeper is None:
            alive_set = set(alive_np.tolist())
            for m, view in self.methods:  # survivors' method info from the end
                for i, extra in zip(view.positions(), m.info()):
                    self.info[i] = extra if i in alive_set else self.info[i]
        if not self.compacted:
            trained = self.keeper.restore(specs, checkpoints) if self.keeper is not None else \
                TrainedStack(specs=specs, probe=self.probe, info=self.info)
        elif self.keeper is not None:
            trained = self.keeper.restore(specs, checkpoints)
        else:
            for k, v in self.probe.state_dict().items():
                self.final[k].index_copy_(0, self.alive, v)
            trained = TrainedStack(specs=specs, probe=ProbeStack(self.probe.cfg, self.probe.in_dim,
                                                                 self.probe.num_classes, [0] * len(specs),
                                                                 state=self.final), info=self.info)
        trained.rungs = [r for r, _ in self.rungs]
        trained.stopped_at = self.stopped.tolist()
        if trained.checkpoint_step is not None:
            trained.checkpoint_step = [c if t == self.total else None
                                       for c, t in zip(trained.checkpoint_step, trained.stopped_at)]
        return trained
