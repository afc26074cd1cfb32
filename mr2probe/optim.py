"""AdamW for stacked heads: every parameter has a leading head axis and each head its own lr and weight decay.

Per element (Loshchilov & Hutter's decoupled AdamW, as torch.optim.AdamW):
    m ← β₁ m + (1−β₁) g,   v ← β₂ v + (1−β₂) g²,
    θ ← θ (1 − η_t λ) − η_t · (m / (1−β₁ᵗ)) / (√(v / (1−β₂ᵗ)) + ε),
with η_t = η · f(t), no warm-up, where step t = 0, 1, … uses the cosine schedule with warm restarts (SGDR,
Loshchilov & Hutter 2017) whose cycles end at e₁ < e₂ < … < e_C = T (e₀ = 0):
    f(t) = ½(1 + cos(π (t − e_{c−1}) / (e_c − e_{c−1})))   for e_{c−1} ≤ t < e_c,   f(t) = 0 for t ≥ T.
One cycle (ends [T]) is the plain cosine schedule ½(1 + cos(π t / T)). Every cycle's last step has f ≈ 0, so the
model at each e_c is annealed; the moments m, v and the step count t run on across restarts. Being elementwise,
a head updated inside a stack moves exactly as it would alone.

Heads leave a stack mid-run (successive halving, :mod:`mr2probe.trainer`): :meth:`StackedAdamW.select_heads`
keeps the rows of the survivors in a group (parameters, m, v, lr, λ: one ``index_select`` each);
:meth:`StackedAdamW.freeze_heads` stops rows of a group that keeps its shape (λ = 0 and m = v = 0, so with a zero
gradient θ stays bit for bit).

The step runs on the device alone: the step count t is a device tensor, the schedule f(t) a device table read at t,
and the update is torch's fused AdamW kernel (``torch._fused_adamw_``: one pass reading θ, g, m, v and writing θ, m,
v, 28 bytes per float32 parameter) over the heads' rows, one call per distinct (lr, weight decay) of the stack with
the learning rate η·f(t) as a device tensor. No Python number changes from step to step, so a step can be
captured as a CUDA graph or compiled with torch.compile without a recompile.
"""
from __future__ import annotations

import bisect
import math
from typing import Sequence

import torch


def cosine_restarts(t: int, ends: Sequence[int]) -> float:
    """f(t) of the module docstring: ½(1 + cos(π (t − e_{c−1}) / (e_c − e_{c−1}))) in the cycle c holding step t
    (e_{c−1} ≤ t < e_c, e₀ = 0), 0 from the last end on. ``ends``: increasing cycle ends e₁ < … < e_C."""
    c = bisect.bisect_right(ends, t)
    if c == len(ends):
        return 0.0
    start = ends[c - 1] if c else 0
    return 0.5 * (1.0 + math.cos(math.pi * (t - start) / (ends[c] - start)))


def restart_ends(checkpoints: Sequence[int]) -> list[int]:
    """``checkpoints`` as cycle ends e₁ < … < e_C (e₁ ≥ 1), checked: checkpoints F, 2F, 4F, … give cycles of F, F, 2F,
    4F, … steps, each ending at a checkpoint."""
    ends = [int(c) for c in checkpoints]
    if not ends or ends[0] < 1 or any(b <= a for a, b in zip(ends, ends[1:])):
        raise ValueError(f"cycle ends must increase from ≥ 1, got {ends}")
    return ends


class StackedAdamW:
    """``groups``: list of (parameters with leading axis h, lr [h], weight decay [h]). The schedule: one cosine
    cycle of ``total_steps``, or warm restarts with cycles ending at ``cycle_ends`` (then ``total_steps`` is their
    last end)."""

    def __init__(self, groups: list[tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]],
                 total_steps: int | None = None, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 cycle_ends: Sequence[int] | None = None) -> None:
        self.groups = [(ps, lr, wd) for ps, lr, wd in groups if ps]
        if cycle_ends is None:
            if total_steps is None:
                raise ValueError("StackedAdamW needs total_steps or cycle_ends")
            cycle_ends = [max(total_steps, 1)]
        self.cycle_ends = restart_ends(cycle_ends)
        self.total_steps, self.betas, self.eps = self.cycle_ends[-1], betas, eps
        first = self.groups[0][0][0] if self.groups else torch.zeros(())
        dev = first.device
        # f(t) for t = 0 … T (f(T) = 0: steps from T on only move the moments), read on the device at t
        self.schedule = torch.tensor([cosine_restarts(t, self.cycle_ends) for t in range(self.total_steps + 1)],
                                     dtype=torch.float64, device=dev).to(first.dtype if first.is_floating_point()
                                                                        else torch.float32)
        self.t = torch.zeros((), dtype=torch.long, device=dev)  # the coming step's t
        self.count = torch.zeros((), dtype=torch.float32, device=dev)  # the fused kernel's step (t + 1 after it)
        self.state = {id(p): (torch.zeros_like(p), torch.zeros_like(p)) for ps, _, _ in self.groups for p in ps}
        self._bucket()

    def _bucket(self) -> None:
        """Per group, its heads by distinct (lr, weight decay) — one fused call each — with the rows of every
        parameter and moment (views, built once: only the gradients' rows are taken per step)."""
        self.buckets = []
        for ps, lr, wd in self.groups:
            pairs = list(zip(lr.tolist(), wd.tolist()))
            keys = sorted(set(pairs))
            heads = [[i for i, pair in enumerate(pairs) if pair == key] for key in keys]
            rows = [(p.detach().unbind(0), *(t.unbind(0) for t in self.state[id(p)])) for p in ps]
            rates = torch.tensor([lr_ for lr_, _ in keys], dtype=self.schedule.dtype, device=self.schedule.device)
            self.buckets.append((rates, [wd_ for _, wd_ in keys], heads, rows))

    def _group(self, params: Sequence[torch.Tensor]) -> int | None:
        """Index of the group holding ``params`` (by identity of its first tensor); None for an empty list."""
        if not params:
            return None
        for i, (ps, _, _) in enumerate(self.groups):
            if ps and ps[0] is params[0]:
                return i
        raise ValueError("these parameters are not in the optimiser")

    @torch.no_grad()
    def select_heads(self, params: Sequence[torch.Tensor], keep: torch.Tensor, kept: Sequence[torch.Tensor]) -> None:
        """Keep only the heads ``keep`` (indices along the head axis, [h']) of the group holding ``params``: its
        parameters become ``kept`` (their owner's new tensors of those rows, ``p[keep]``, in the same order), its
        moments, lr and weight decay their rows ``keep``. The step count t and the schedule run on. (New tensors, not
        ``p.data = p.data[keep]``: autograd keeps a parameter's shape in its gradient node.)"""
        i = self._group(params)
        if i is None:
            return
        ps, lr, wd = self.groups[i]
        for p, q in zip(ps, kept, strict=True):
            m, v = self.state.pop(id(p))
            self.state[id(q)] = (m.index_select(0, keep), v.index_select(0, keep))
        self.groups[i] = (list(kept), lr.index_select(0, keep), wd.index_select(0, keep))
        self._bucket()

    @torch.no_grad()
    def freeze_heads(self, params: Sequence[torch.Tensor], frozen: torch.Tensor) -> None:
        """Stop the heads ``frozen`` ([h] bool) of the group holding ``params`` without changing its shape: λ = 0 and
        m = v = 0 on their rows. With a zero gradient there (their losses left out) m and v stay 0, θ(1 − η_tλ) = θ
        and the step η_t (m/c₁)/(√(v/c₂) + ε) = 0: the rows do not move at all."""
        i = self._group(params)
        if i is None:
            return
        ps, lr, wd = self.groups[i]
        frozen = frozen.to(lr.device)
        for p in ps:
            rows = frozen.reshape((-1,) + (1,) * (p.ndim - 1))
            for t in self.state[id(p)]:
                t.masked_fill_(rows, 0.0)
        self.groups[i] = (ps, lr, wd.masked_fill(frozen, 0.0))
        self._bucket()

    def _traced_step(self, f: torch.Tensor) -> None:
        """The fused kernel's update of every parameter row by row in stacked elementwise ops (per-head η_t, λ)."""
        b1, b2 = self.betas
        c1, c2 = 1 - torch.pow(b1, self.count), 1 - torch.pow(b2, self.count)
        for ps, lr, wd in self.groups:
            eta = lr * f  # [h]
            for p in ps:
                if p.grad is None:
                    continue
                shape = (-1,) + (1,) * (p.ndim - 1)
                m, v = self.state[id(p)]
                m.lerp_(p.grad, 1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                p.mul_((1 - eta * wd).reshape(shape))
                p.sub_((eta / c1).reshape(shape) * m / ((v / c2).sqrt() + self.eps))

    def lr_factor(self) -> float:
        """f(t) of the schedule at the coming step t (reads the device: not for the training loop)."""
        return cosine_restarts(int(self.t), self.cycle_ends)

    def zero_grad(self) -> None:
        for ps, _, _ in self.groups:
            for p in ps:
                p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """One AdamW step of every head: η_t = η·f(t) from the device's schedule table, then per (lr, weight decay)
        one fused pass over those heads' rows: m ← β₁m + (1−β₁)g, v ← β₂v + (1−β₂)g², θ ← θ(1 − η_tλ) −
        η_t (m/c₁)/(√(v/c₂) + ε), c = 1 − βᵗ⁺¹ from the device step count."""
        b1, b2 = self.betas
        f = self.schedule.index_select(0, self.t.clamp_max(self.total_steps))  # [1]
        self.t.add_(1)
        self.count.add_(1)
        if torch.compiler.is_compiling():  # the fused kernel has no tracing rule: the same update in elementwise ops,
            self._traced_step(f)  # which the compiler fuses into one pass per parameter
            return
        for (ps, _, _), (rates, decays, heads, rows) in zip(self.groups, self.buckets):
            grads = [p.grad.unbind(0) if p.grad is not None else None for p in ps]
            etas = (rates * f).unbind(0)
            for eta, wd, members in zip(etas, decays, heads):
                todo = [(r, g) for r, g in zip(rows, grads) if g is not None]
                if not todo:
                    continue
                torch._fused_adamw_([r[0][i] for r, _ in todo for i in members],
                                    [g[i] for _, g in todo for i in members],
                                    [r[1][i] for r, _ in todo for i in members],
                                    [r[2][i] for r, _ in todo for i in members], [],
                                    [self.count] * (len(todo) * len(members)), lr=eta, beta1=b1, beta2=b2,
                                    weight_decay=wd, eps=self.eps, amsgrad=False, maximize=False)
