"""AdamW for stacked heads: every parameter has a leading head axis and each head its own lr and weight decay.

Per element (Loshchilov & Hutter's decoupled AdamW, as torch.optim.AdamW):
    m ← β₁ m + (1−β₁) g,   v ← β₂ v + (1−β₂) g²,
    θ ← θ (1 − η_t λ) − η_t · (m / (1−β₁ᵗ)) / (√(v / (1−β₂ᵗ)) + ε),
with η_t = η · ½(1 + cos(π t / T)) (cosine schedule, no warm-up). Being elementwise, a head updated inside
a stack moves exactly as it would alone.
"""
from __future__ import annotations

import math

import torch


class StackedAdamW:
    """``groups``: list of (parameters with leading axis h, lr [h], weight decay [h])."""

    def __init__(self, groups: list[tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]],
                 total_steps: int, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.groups = [(ps, lr, wd) for ps, lr, wd in groups if ps]
        self.total_steps, self.betas, self.eps, self.t = max(total_steps, 1), betas, eps, 0
        self.state = {id(p): (torch.zeros_like(p), torch.zeros_like(p)) for ps, _, _ in self.groups for p in ps}
        # one scratch tensor per parameter, reused every step: a step allocates nothing of the parameter's size
        # (fresh multi-MB buffers cost page faults on every step of a large stack)
        self.scratch = {id(p): torch.empty_like(p) for ps, _, _ in self.groups for p in ps}

    def lr_factor(self) -> float:
        return 0.5 * (1.0 + math.cos(math.pi * min(self.t, self.total_steps) / self.total_steps))

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
