"""Probes: an optional trainable adapter g followed by a head h, stacked over H independent runs.

Every parameter carries a leading head axis, so the heads of many runs (method × seed × grid point) are
evaluated together: with no adapter, one matrix product ``x @ W.view(H·K, D)ᵀ`` gives all logits.

Heads (``HEADS``):   linear  h(z) = W z + b
                     cosine  h(z)_k = s · <w_k/‖w_k‖, z/‖z‖>   (s fixed or learnable)
Adapters (``ADAPTERS``): none (identity), linear (A x + a), mlp (A₂ relu(A₁ x + a₁) + a₂).
Entries are :class:`Head` / :class:`Adapter` subclasses, built by ``HEADS.create(name)`` / ``ADAPTERS.create(name)``.
The representation MR2 regularises is what the classifier sees: z for linear heads, z/‖z‖ for cosine heads.
Each head is initialised from its own seed (PyTorch's nn.Linear rule, U(±1/√fan_in)), so a head trained
inside a stack starts exactly where it would start alone.
"""
from __future__ import annotations

import math
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from .errors import UserError
from .registry import Registry, Spec


@dataclass
class ProbeConfig:
    """What the probe looks like (the same for every head of a stack)."""

    head: str = "linear"  # linear | cosine
    adapter: str = "none"  # none | linear | mlp
    width: int = 256  # adapter output width d
    scale: float = 16.0  # cosine head scale s
    learn_scale: bool = False  # make s trainable (per head)

    def check(self) -> None:
        HEADS.get(self.head)
        ADAPTERS.get(self.adapter)
        if self.width < 1:
            raise UserError(f"--width must be ≥ 1, got {self.width}")
        if not self.scale > 0:
            raise UserError(f"--scale must be > 0, got {self.scale}")


_INIT_DEVICE: ContextVar[torch.device] = ContextVar("init_device", default=torch.device("cpu"))


def _uniform(shape: tuple[int, ...], fan_in: int, gen: torch.Generator) -> torch.Tensor:
    bound = 1.0 / math.sqrt(fan_in)
    return torch.rand(shape, generator=gen, device=gen.device) * (2 * bound) - bound


def _stacked(seeds: list[int], salt: int, shape: tuple[int, ...], fan_in: int) -> torch.Tensor:
    """One tensor [H, *shape], head h drawn from a generator seeded by (seed_h, salt), on the device the stack is
    built for (a GPU's generator draws other numbers than a CPU's: a stack built on a GPU starts elsewhere, the same
    on every run there)."""
    dev = _INIT_DEVICE.get()
    return torch.stack([_uniform(shape, fan_in, torch.Generator(dev).manual_seed(s * 1000 + salt)) for s in seeds])


class Adapter(Spec):
    """Base: ``init(seeds, D, width) -> params``; ``forward(x [B, D], params) -> z [H or 1, B, d]``.
    ``ADAPTERS.create(name)`` builds one (``build(options)`` = ``cls()``: an adapter takes no options)."""

    @classmethod
    def build(cls, options: Any) -> "Adapter":
        return cls()

    def out_dim(self, in_dim: int, width: int) -> int:
        return width

    def init(self, seeds: list[int], in_dim: int, width: int) -> dict[str, torch.Tensor]:
        return {}


class Head(Spec):
    """Base: ``init(seeds, K, d, cfg, scales)`` and ``logits(z [H|1, B, d], params) -> [H, B, K]``; ``scales`` [H]
    are the heads' cosine scales (a hyperparameter selected on val like lr; ignored by heads without one).
    ``HEADS.create(name)`` builds one (``build(options)`` = ``cls()``).

    ``represent`` is the head's own transform of its input g(x) before the classifier (identity here; cosine:
    z = g(x)/‖g(x)‖); a head that overrides it declares ``has_own_transform = True`` (then g(x) and z differ)."""

    has_own_transform: ClassVar[bool] = False

    @classmethod
    def build(cls, options: Any) -> "Head":
        return cls()

    def represent(self, z: torch.Tensor) -> torch.Tensor:
        return z


ADAPTERS: Registry[type[Adapter]] = Registry("adapter", base=Adapter)
HEADS: Registry[type[Head]] = Registry("head", base=Head)


@ADAPTERS.register("none", help="identity: the probe sees the frozen features")
class NoAdapter(Adapter):
    def out_dim(self, in_dim: int, width: int) -> int:
        return in_dim

    def forward(self, x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
        return x.unsqueeze(0)


@ADAPTERS.register("linear", help="trainable linear map D → width")
class LinearAdapter(Adapter):
    def init(self, seeds: list[int], in_dim: int, width: int) -> dict[str, torch.Tensor]:
        return {"A": _stacked(seeds, 1, (in_dim, width), in_dim), "a": _stacked(seeds, 2, (width,), in_dim)}

    def forward(self, x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
        h, d = p["a"].shape
        return (x @ p["A"].permute(1, 0, 2).reshape(x.shape[1], h * d)).view(-1, h, d).transpose(0, 1) \
            + p["a"][:, None, :]


@ADAPTERS.register("mlp", help="trainable 2-layer MLP D → width → width (ReLU)")
class MLPAdapter(LinearAdapter):
    def init(self, seeds: list[int], in_dim: int, width: int) -> dict[str, torch.Tensor]:
        return {**super().init(seeds, in_dim, width), "A2": _stacked(seeds, 3, (width, width), width),
                "a2": _stacked(seeds, 4, (width,), width)}

    def forward(self, x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.baddbmm(p["a2"][:, None, :], F.relu(super().forward(x, p)), p["A2"])


def _affine(z: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """[H|1, B, d] × W [H, K, d] (+ b [H, K]) → [H, B, K]; one GEMM when z is shared by all heads."""
    h, k, d = w.shape
    if z.shape[0] == 1:  # the bias in the product (addmm), not a pass of its own over the logits
        flat = z[0] @ w.reshape(h * k, d).T if b is None else torch.addmm(b.reshape(h * k), z[0], w.reshape(h * k, d).T)
        return flat.view(-1, h, k).transpose(0, 1)
    return torch.bmm(z, w.transpose(1, 2)) if b is None else torch.baddbmm(b[:, None, :], z, w.transpose(1, 2))


@HEADS.register("linear", help="h(z) = W z + b")
class LinearHead(Head):
    def init(self, seeds: list[int], k: int, d: int, cfg: ProbeConfig, scales: list[float]
             ) -> dict[str, torch.Tensor]:
        return {"W": _stacked(seeds, 5, (k, d), d), "b": _stacked(seeds, 6, (k,), d)}

    def logits(self, z: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
        return _affine(z, p["W"], p["b"])


@HEADS.register("cosine", help="h(z)_k = s · cos(w_k, z), scale s per head (--scale grid on val, --learn-scale)")
class CosineHead(Head):
    has_own_transform: ClassVar[bool] = True

    def init(self, seeds: list[int], k: int, d: int, cfg: ProbeConfig, scales: list[float]
             ) -> dict[str, torch.Tensor]:
        p = {"W": _stacked(seeds, 5, (k, d), d)}
        p["log_s" if cfg.learn_scale else "_log_s"] = torch.tensor([math.log(s) for s in scales])
        return p

    def represent(self, z: torch.Tensor) -> torch.Tensor:
        return F.normalize(z, dim=-1)

    def logits(self, z: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
        """``z`` is already normalised (``represent``)."""
        s = (p["log_s"] if "log_s" in p else p["_log_s"]).exp()
        # s folded into the normalised weights [H, K, d] (one pass over the weights, not over the logits [H, B, K])
        return _affine(z, s[:, None, None] * F.normalize(p["W"], dim=-1), None)


@dataclass
class HeadSet:
    """h classifier heads of one kind with parameters of their own and no adapter, outside any probe stack (a
    method's auxiliary heads, e.g. LfF's biased heads): ``logits(z [h|1, B, d]) -> [h, B, K]`` of the representation
    the classifiers see (already through the head's transform, as ``ProbeStack.represent`` gives it). Parameters
    whose name starts with ``_`` are fixed (a non-learnable cosine scale); the others are trainable leaves."""

    head: Head
    params: dict[str, torch.Tensor]

    @classmethod
    def fresh(cls, cfg: ProbeConfig, seeds: list[int], num_classes: int, dim: int, scales: list[float],
              device: torch.device, dtype: torch.dtype) -> "HeadSet":
        """Heads of ``cfg.head`` on inputs of width ``dim``, each initialised from its seed by the CPU's generator (the
        same numbers whatever the training device), then moved to ``device`` and ``dtype``."""
        head: Head = HEADS.create(cfg.head)
        params = head.init(seeds, num_classes, dim, cfg, scales)
        return cls(head, {n: t.to(device=device, dtype=dtype).requires_grad_(not n.startswith("_"))
                          for n, t in params.items()})

    def logits(self, z: torch.Tensor) -> torch.Tensor:
        return self.head.logits(z, self.params)

    def trainable(self) -> list[torch.Tensor]:
        return [t for n, t in self.params.items() if not n.startswith("_")]


class ProbeStack(torch.nn.Module):
    """H probes with the same shape: ``forward(x [B, D]) -> (representation [H|1, B, d], logits [H, B, K])``.

    ``scales`` [H]: each head's (initial) cosine scale; default ``cfg.scale`` for every head. ``state``: the
    parameters to hold instead of an initialisation (as :meth:`select` returns them; ``seeds`` then only counts the
    heads). Parameters whose name starts with ``_`` are fixed buffers (e.g. a non-learnable cosine scale)."""

    def __init__(self, cfg: ProbeConfig, in_dim: int, num_classes: int, seeds: list[int],
                 scales: list[float] | None = None, state: dict[str, torch.Tensor] | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        cfg.check()
        scales = [cfg.scale] * len(seeds) if scales is None else list(scales)
        if len(scales) != len(seeds) or any(not s > 0 for s in scales):
            raise UserError(f"cosine scales must be > 0, one per head; got {scales}")
        self.cfg, self.num_heads, self.in_dim, self.num_classes = cfg, len(seeds), in_dim, num_classes
        self.adapter, self.head = ADAPTERS.create(cfg.adapter), HEADS.create(cfg.head)
        self.out_dim = self.adapter.out_dim(in_dim, cfg.width)
        token = _INIT_DEVICE.set(torch.device(device or "cpu"))  # heads initialised where they train
        try:
            params = state if state is not None else {
                **{f"adapter_{n}": t for n, t in self.adapter.init(seeds, in_dim, cfg.width).items()},
                **{f"head_{n}": t for n, t in self.head.init(seeds, num_classes, self.out_dim, cfg, scales).items()}}
        finally:
            _INIT_DEVICE.reset(token)
        for name, t in params.items():
            if name.split("_", 1)[1].startswith("_"):
                self.register_buffer(name, t)
            else:
                self.register_parameter(name, torch.nn.Parameter(t))

    def _group(self, prefix: str) -> dict[str, torch.Tensor]:
        items = list(self.named_parameters()) + list(self.named_buffers())
        return {n[len(prefix):]: t for n, t in items if n.startswith(prefix)}

    def represent(self, x: torch.Tensor, heads: slice | None = None) -> torch.Tensor:
        """z(x) [H|1, B, d] the classifiers see, of all heads or of ``heads`` only."""
        return self.head.represent(self.adapter_output(x, heads))

    def logits(self, x: torch.Tensor, heads: slice) -> torch.Tensor:
        """Logits [h, B, K] of the heads ``heads`` alone: only their adapters and classifiers are evaluated."""
        return self.head.logits(self.represent(x, heads), {n: t[heads] for n, t in self._group("head_").items()})

    def adapter_output(self, x: torch.Tensor, heads: slice | None = None) -> torch.Tensor:
        """g(x) [H|1, B, d] before the head's own transform (cosine: before z/‖z‖), of all heads or of ``heads``
        only (their adapters alone are evaluated); the identity adapter gives the features x, [1, B, D]."""
        p = self._group("adapter_")
        return self.adapter.forward(x, p if heads is None else {n: t[heads] for n, t in p.items()})

    def forward(self, x: torch.Tensor, detach: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``detach`` [H] bool: those heads' classifiers see a detached representation (no gradient reaches
        the adapter through their loss), as when an adapter is trained by its own objective (SupCon)."""
        z = self.represent(x)
        zh = z if detach is None or z.shape[0] == 1 else torch.where(detach[:, None, None], z.detach(), z)
        return z, self.head.logits(zh, self._group("head_"))

    def select(self, heads: slice | list[int]) -> dict[str, torch.Tensor]:
        """A copy of the parameters of some heads (for saving a selected run)."""
        return {n: t.detach()[heads].clone() for n, t in self.state_dict().items()}

    @classmethod
    def concat(cls, stacks: list["ProbeStack"]) -> "ProbeStack":
        """One stack of the heads of ``stacks`` (same config and shapes), in order, on their device and dtype."""
        first, states = stacks[0], [s.state_dict() for s in stacks]
        return cls(first.cfg, first.in_dim, first.num_classes, [0] * sum(s.num_heads for s in stacks),
                   state={k: torch.cat([st[k] for st in states]) for k in states[0]})

    @classmethod
    def from_state(cls, cfg: ProbeConfig, in_dim: int, num_classes: int, state: dict[str, torch.Tensor]
                   ) -> "ProbeStack":
        """The stack of the heads in ``state`` (as :meth:`select` returns it), ready to evaluate."""
        n = next(iter(state.values())).shape[0]
        probe = cls(cfg, in_dim, num_classes, [0] * n)
        probe.load_state_dict({k: v.to(torch.float32) for k, v in state.items()})
        return probe
