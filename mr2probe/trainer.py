"""The trainer: many probe heads trained together on cached features (one stack per seed).

All runs that share a seed (every method × grid point) form one ``ProbeStack``: one matrix product evaluates
all their logits on a batch, each method computes its heads' losses vectorised, one backward pass, and a
``StackedAdamW`` step with per-head lr and weight decay. A run's seed fixes both its initialisation and its
data order, so a head trained inside a stack follows the same trajectory as trained alone (up to float
rounding of the larger product).

Features are tensors on the training device, or — when they do not fit the memory cap — a
:class:`~mr2probe.source.StreamedFeatures` read from the feature file: the trainer only slices them
(``x[i:j]``, in chunks) and draws training batches through :func:`epoch_batches`.
"""
from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from .errors import UserError
from .heads import ProbeConfig, ProbeStack
from .methods import METHODS, Batch, FitContext, Method
from .optim import StackedAdamW
from .progress import progress_bar
from .source import StreamedFeatures

EVAL_CHUNK = 8192


@dataclass
class TrainConfig:
    """Training settings shared by all runs. Grid: lr × weight decay, plus each method's own ``grid``."""

    epochs: int = 30
    batch_size: int = 512
    lrs: tuple[float, ...] = (1e-3, 1e-2)
    weight_decays: tuple[float, ...] = (1e-4, 1e-1)
    method_params: dict[str, dict[str, Any]] = field(default_factory=dict)  # fixed overrides per method
    use_method_grids: bool = True
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    device: str | None = None
    progress: bool = True

    def check(self) -> None:
        self.probe.check()
        if self.epochs < 1:
            raise UserError(f"--epochs must be ≥ 1, got {self.epochs}")
        if self.batch_size < 2:
            raise UserError(f"--batch-size must be ≥ 2, got {self.batch_size}")
        if not self.lrs or any(not 0 < lr < float("inf") for lr in self.lrs):
            raise UserError(f"--lr values must be finite and > 0, got {list(self.lrs)}")
        if not self.weight_decays or any(not 0 <= wd < float("inf") for wd in self.weight_decays):
            raise UserError(f"--wd values must be finite and ≥ 0, got {list(self.weight_decays)}")


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


def method_hparams(method: str, cfg: TrainConfig) -> list[dict[str, Any]]:
    """Every grid point of a method: defaults ⊕ fixed overrides ⊕ (lr × wd × method grid)."""
    cls = METHODS.get(method)
    fixed = cfg.method_params.get(method, {})
    unknown = set(fixed) - set(cls.defaults)
    if unknown:
        raise UserError(f"method {method!r} has no hyperparameter {', '.join(sorted(unknown))}; it has: "
                        f"{', '.join(sorted(cls.defaults)) or 'none'}")
    grid = {"lr": list(cfg.lrs), "weight_decay": list(cfg.weight_decays)}
    if cfg.use_method_grids:
        grid.update({k: v for k, v in cls.grid.items() if k not in fixed})
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
    return torch.device(device) if device else torch.device("cuda" if torch.cuda.is_available() else "cpu")


def chunk_rows(x: torch.Tensor | StreamedFeatures) -> int:
    """Rows per evaluation chunk: EVAL_CHUNK, or less for streamed features (at most one block)."""
    return min(EVAL_CHUNK, x.block_rows) if isinstance(x, StreamedFeatures) else EVAL_CHUNK


def epoch_batches(x: torch.Tensor | StreamedFeatures, batch_size: int, gen: torch.Generator
                  ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch of (positions in the training set, features) batches, in an order fixed by ``gen``: a random
    permutation in memory; for streamed features shuffled blocks (``StreamedFeatures.batches``). Both have
    ⌈N / batch_size⌉ batches."""
    if isinstance(x, StreamedFeatures):
        yield from x.batches(batch_size, gen)
        return
    order = torch.randperm(len(x), generator=gen).to(x.device)
    for idx in order.split(batch_size):
        yield idx, x[idx]


@dataclass
class TrainedStack:
    """The result of training one stack: its runs, the probe and each head's method info."""

    specs: list[RunSpec]
    probe: ProbeStack
    info: list[dict[str, Any]]

    @torch.no_grad()
    def predict(self, x: torch.Tensor | StreamedFeatures, heads: list[int] | None = None) -> torch.Tensor:
        """Logits [H, N, K] (or of the chosen heads), evaluated in chunks."""
        c = chunk_rows(x)
        outs = [self.probe(x[i:i + c])[1] for i in range(0, len(x), c)]
        logits = torch.cat(outs, dim=1)
        return logits if heads is None else logits[heads]


def _slices(specs: list[RunSpec]) -> list[tuple[str, slice]]:
    """Contiguous (method, heads) slices of a stack whose specs are grouped by method."""
    out, start = [], 0
    for method, group in itertools.groupby(specs, key=lambda s: s.method):
        n = len(list(group))
        out.append((method, slice(start, start + n)))
        start += n
    return out


def train_stack(data: TrainData, specs: list[RunSpec], cfg: TrainConfig,
                log: Callable[[str], None] = lambda m: None, epochs: int | None = None,
                description: str = "train", bar: Any = None) -> TrainedStack:
    """Train the heads of ``specs`` (all with one seed) together; returns the trained stack."""
    seeds = {s.seed for s in specs}
    if len(seeds) != 1:
        raise ValueError("a stack trains runs of one seed")
    seed = seeds.pop()
    epochs = epochs or cfg.epochs
    specs = sorted(specs, key=lambda s: s.method)  # stable: grid order kept inside a method
    probe = ProbeStack(cfg.probe, data.x.shape[1], data.num_classes, [s.seed for s in specs]).to(
        device=data.x.device, dtype=data.x.dtype)
    n = len(data.y)
    steps_per_epoch = -(-n // cfg.batch_size)

    shared: dict[Any, Any] = {}

    def make_ctx(sl: slice) -> FitContext:
        def represent_train() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
            c = chunk_rows(data.x)
            with torch.no_grad():
                for i in range(0, n, c):
                    z = probe.represent(data.x[i:i + c])
                    yield (z if z.shape[0] == 1 else z[sl]), data.y[i:i + c]

        def predict(x: torch.Tensor | StreamedFeatures) -> torch.Tensor:
            c = chunk_rows(x)
            with torch.no_grad():
                return torch.cat([probe(x[i:i + c])[1][sl] for i in range(0, len(x), c)], 1)

        def train_aux(method: str, hparams: list[dict[str, Any]], aux_epochs: int) -> torch.Tensor:
            aux = [RunSpec(method, tuple(sorted(hp.items())), seed) for hp in hparams]
            trained = train_stack(data, aux, cfg, log, epochs=aux_epochs, description=f"{description} (stage 1)")
            return trained.predict(data.x)

        return FitContext(x=data.x, y=data.y, val_x=data.val_x, val_y=data.val_y, num_classes=data.num_classes,
                          probe=cfg.probe, epochs=epochs, batch_size=cfg.batch_size, rep_dim=probe.out_dim, seed=seed,
                          represent_train=represent_train, predict=predict, train_aux=train_aux, log=log,
                          shared=shared)

    methods: list[tuple[Method, slice]] = []
    for name, sl in _slices(specs):
        cls = METHODS.get(name)
        if cls.needs_adapter and cfg.probe.adapter == "none":
            raise UserError(f"method {name!r} needs a trainable adapter: pass --adapter linear or mlp")
        m = cls([s.params for s in specs[sl]], make_ctx(sl))
        m.name = name
        methods.append((m, sl))
    for m, _ in methods:
        m.prepare()

    lr = torch.tensor([s.params["lr"] for s in specs], dtype=data.x.dtype, device=data.x.device)
    wd = torch.tensor([s.params["weight_decay"] for s in specs], dtype=data.x.dtype, device=data.x.device)
    groups = [(list(probe.parameters()), lr, wd)]
    groups += [(m.extra_parameters(), lr[sl], wd[sl]) for m, sl in methods]
    opt = StackedAdamW(groups, total_steps=epochs * steps_per_epoch)
    detach = torch.zeros(len(specs), dtype=torch.bool, device=data.x.device)
    for m, sl in methods:
        detach[sl] = type(m).detach_head_input
    detach = detach if bool(detach.any()) else None
    sizes = [sl.stop - sl.start for _, sl in methods]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    own = progress_bar(f"{description} seed {seed}: {len(specs)} heads", total=epochs * steps_per_epoch,
                       enabled=cfg.progress and bar is None)
    with own if bar is None else contextlib.nullcontext(bar) as bar:
        for epoch in range(epochs):
            bar.update(description=f"{description} · seed {seed} · {len(specs)} heads · epoch {epoch + 1}/{epochs}")
            for m, _ in methods:
                m.on_epoch_start(epoch)
            for idx, xb in epoch_batches(data.x, cfg.batch_size, gen):
                yb = data.y[idx]
                rep, logits = probe(xb, detach)
                # split, not one slice per method: its backward is one concatenation of the methods' logit
                # gradients, where slicing would zero-fill a full [H, B, K] gradient per method and add them
                parts = logits.split(sizes)
                reps = rep.split(sizes) if rep.shape[0] > 1 else [rep] * len(methods)
                loss = sum(m.loss(Batch(lg, r, yb, idx)).sum() for (m, _), lg, r in zip(methods, parts, reps))
                if not torch.isfinite(loss):
                    raise UserError(f"training diverged (loss {loss.item()}) at epoch {epoch}; lower --lr")
                opt.zero_grad()
                loss.backward()
                opt.step()
                bar.advance()
    opt.zero_grad()
    info: list[dict[str, Any]] = [{} for _ in specs]
    for m, sl in methods:
        for i, extra in zip(range(sl.start, sl.stop), m.info()):
            info[i] = extra
    return TrainedStack(specs=specs, probe=probe, info=info)
