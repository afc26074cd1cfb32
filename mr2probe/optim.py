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
        self.total_steps, self.betas, self.eps, self.t = self.cycle_ends[-1], betas, eps, 0
        self.state = {id(p): (torch.zeros_like(p), torch.zeros_like(p)) for ps, _, _ in self.groups for p in ps}
        # one scratch tensor per parameter, reused every step: a step allocates nothing of the parameter's size
        # (fresh multi-MB buffers cost page faults on every step of a large stack)
        self.scratch = {id(p): torch.empty_like(p) for ps, _, _ in self.groups for p in ps}

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
        moments, scratch tensors, lr and weight decay their rows ``keep``. The step count t and the schedule run
        on. (New tensors, not ``p.data = p.data[keep]``: autograd keeps a parameter's shape in its gradient node.)"""
        i = self._group(params)
        if i is None:
            return
        ps, lr, wd = self.groups[i]
        for p, q in zip(ps, kept, strict=True):
            m, v = self.state.pop(id(p))
            self.state[id(q)] = (m.index_select(0, keep), v.index_select(0, keep))
            del self.scratch[id(p)]
            self.scratch[id(q)] = torch.empty_like(q)
        self.groups[i] = (list(kept), lr.index_select(0, keep), wd.index_select(0, keep))

    @torch.no_grad()
    def freeze_heads(self, params: Sequence[torch.Tensor], frozen: torch.Tensor) -> None:
        """Stop the heads ``frozen`` ([h] bool) of the group holding ``params`` without changing its shape: λ = 0 and
        m = v = 0 on their rows. With a zero gradient there (their losses left out) m and v stay 0, θ(1 − η_tλ) = θ
        and m / d = 0 (d = ε·c₁/η_t > 0): the rows do not move at all."""
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

    def lr_factor(self) -> float:
        """f(t) of the schedule at the coming step t."""
        return cosine_restarts(self.t, self.cycle_ends)

    def zero_grad(self) -> None:
        for ps, _, _ in self.groups:
            for p in ps:
                p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """Eight passes over each parameter: m ← lerp(m, g, 1−β₁); v ← β₂v + (1−β₂)g²; θ ← θ(1 − η_tλ); then
        θ ← θ − m / d with d = √v · c₁/(η_t√c₂) + ε·c₁/η_t, which is η_t (m/c₁) / (√(v/c₂) + ε) rearranged so that
        the per-head factors multiply the one scratch tensor d (c₁ = 1−β₁ᵗ, c₂ = 1−β₂ᵗ)."""
        b1, b2 = self.betas
        factor = self.lr_factor()
        self.t += 1
        c1, c2 = 1 - b1 ** self.t, 1 - b2 ** self.t
        for ps, lr, wd in self.groups:
            eta = (lr * factor).clamp_min(torch.finfo(lr.dtype).tiny)  # [h]; > 0: it divides below
            for p in ps:
                if p.grad is None:
                    continue
                shape = (-1,) + (1,) * (p.ndim - 1)
                m, v = self.state[id(p)]
                m.lerp_(p.grad, 1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                if factor == 0:  # the schedule's end: no step
                    continue
                p.mul_((1 - eta * wd).reshape(shape))
                d = torch.sqrt(v, out=self.scratch[id(p)])
                d.mul_((c1 / (eta * math.sqrt(c2))).reshape(shape)).add_((self.eps * c1 / eta).reshape(shape))
                p.addcdiv_(m, d, value=-1)
