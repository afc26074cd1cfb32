"""Class-wise χ² DRO in the spirit of FairDRO (Jung et al., ICLR 2023), with the classes as the groups."""
from __future__ import annotations

from typing import Any

import torch

from ..errors import UserError
from ..losses import class_mean_weights, class_means, label_counts
from ._base import METHODS, Batch, Method


@torch.no_grad()
def chi2_simplex_weights(losses: torch.Tensor, present: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """The exact maximiser q [h, K] of Σ_k q_k ℓ_k over {q ≥ 0, Σ q = 1, (1/K') Σ_k (K' q_k − 1)² ≤ α²}.

    losses [h, K], present [K] bool (the K' classes taking part; the others get q = 0), alpha [h] ≥ 0.
    KKT: q_k = (ℓ_k − η)₊ / Σ_j (ℓ_j − η)₊ with the largest η whose q is in the ball (the divergence
    D(η) = K' Σ q² − 1 grows with η). With the losses sorted, ℓ₍₁₎ ≥ … ≥ ℓ₍K'₎, the support is the top m with
    m the smallest size whose D at η = ℓ₍m+1₎ is ≤ α²; on it, with μ, Σa² the mean and sum of squared
    deviations of the top m losses, q₍i₎ = (1 + (ℓ₍i₎ − μ)/t)/m,  t = sqrt(K' Σa² / (m² (1 + α² − K'/m))).
    If α² ≥ K'/m₀ − 1 (m₀ = number of losses tied at the maximum) the ball holds that face: q is uniform on
    the tied maxima. m = K' is the closed form q_k = (1 + α(ℓ_k − ℓ̄)/σ)/K', used whenever it is ≥ 0.
    Computed in float64; one sort and prefix sums per head, no loop over classes."""
    dtype = losses.dtype
    ls = losses.to(torch.float64).masked_fill(~present[None, :], -torch.inf)
    s, order = ls.sort(1, descending=True)  # [h, K], absent classes last
    k = present.sum().to(torch.float64)  # K'
    rank = torch.arange(ls.shape[1], device=ls.device)
    valid = rank < present.sum()  # [K]: sorted positions of present classes
    d = torch.where(valid, s - s[:, :1], torch.zeros_like(s))  # shifted by the maximum: ≤ 0
    m = (rank + 1).to(torch.float64)
    s1, s2 = d.cumsum(1), (d * d).cumsum(1)  # prefix sums of the top m
    nxt = torch.cat([d[:, 1:], torch.zeros_like(d[:, :1])], 1)  # ℓ₍m+1₎ (shifted)
    sum_d = s1 - m * nxt  # Σ_{i≤m} (ℓ₍i₎ − ℓ₍m+1₎)
    sum_d2 = s2 - 2 * nxt * s1 + m * nxt * nxt
    div = torch.where(sum_d > 0, k * sum_d2 / sum_d.clamp_min(1e-300) ** 2 - 1, torch.inf)  # D(ℓ₍m+1₎)
    div = torch.where(rank < present.sum() - 1, div, torch.zeros_like(div))  # m ≥ K': η → −∞, D → 0
    a2 = alpha.to(torch.float64)[:, None] ** 2
    j = (div > a2).long().cumprod(1).sum(1, keepdim=True)  # first feasible index: support size m = j + 1
    mm = j.to(torch.float64) + 1
    mu = s1.gather(1, j) / mm
    ssq = (s2.gather(1, j) - mm * mu * mu).clamp_min(0)
    c = (1 + a2 - k / mm).clamp_min(0)
    inv_t = (mm * mm * c / (k * ssq).clamp_min(1e-300)).sqrt()  # 1/t (0 for α = 0: uniform weights)
    inv_t = torch.where(ssq > 0, inv_t, torch.zeros_like(inv_t))  # top m equal (up to rounding): uniform on them
    q = torch.where(rank[None, :] <= j, (1 + (d - mu) * inv_t).clamp_min(0) / mm, torch.zeros_like(d))
    tied = (d == 0) & valid
    m0 = tied.sum(1, keepdim=True).to(torch.float64)
    q = torch.where(a2 >= k / m0 - 1, tied / m0, q)  # the ball holds the face of the tied maxima
    q = q / q.sum(1, keepdim=True)
    return torch.zeros_like(q).scatter(1, order, q).to(dtype)


@METHODS.register("fair_dro", help="χ²-DRO over the batch's classes: Σ q_k ℓ_k at the exact worst-case q on simplex ∩ "
                  "χ² ball of radius α (after Jung et al., ICLR 2023; classes replace its sensitive groups)")
class FairDRO(Method):
    """ℓ = max_q Σ_k q_k ℓ_k  over  {q ≥ 0, Σ_k q_k = 1, (1/K') Σ_k (K' q_k − 1)² ≤ α²},
    ℓ_k = mean CE over the batch samples of class k, K' = the classes present in the batch (the others get 0).

    Exact variant [choice]: FairDRO's re-weighting view (a χ²-ball DRO over group weights, solved in closed form
    at every step, then one gradient step with the weights fixed) with the sensitive groups replaced by the
    classes, and the maximiser taken over the simplex exactly (``chi2_simplex_weights``): q_k ≥ 0 for every
    radius α. While the unconstrained closed form q_k = (1 + α (ℓ_k − ℓ̄)/σ)/K' is ≥ 0 (always for
    α ≤ 1/√(K'−1)) the two coincide and ℓ = ℓ̄ + α·σ (population std over the present classes); for larger α
    the smallest class losses get weight 0, and for α² ≥ K' − 1 all weight goes to the worst class.
    q is held fixed in the backward pass: by Danskin's theorem that is the gradient of the worst-case value
    (in the closed-form regime, the gradient of ℓ̄ + α·σ, which pulls the class losses together).

    Hyperparameters: ``alpha`` α, the radius (default 0.5; grid 0.5, 1)."""

    defaults: dict[str, Any] = {"alpha": 0.5}
    grid: dict[str, list] = {"alpha": [0.5, 1.0]}

    @classmethod
    def check(cls, hp: dict[str, Any]) -> None:
        if not hp["alpha"] >= 0:
            raise UserError(f"alpha must be ≥ 0, got {hp['alpha']}")

    reweights = True

    def prepare(self) -> None:
        self.q = torch.zeros(self.h, self.ctx.data.num_classes, dtype=self.ctx.data.dtype, device=self.ctx.data.device)
        self.stepped = False

    @torch.no_grad()
    def sample_weights(self, c: torch.Tensor, batch: Batch, c_aux: torch.Tensor | None) -> torch.Tensor:
        """The worst-case q of this batch's class losses (in place), as per-sample weights of Σ_k q_k ℓ_k."""
        k = self.ctx.data.num_classes
        counts = label_counts(batch.y, k, c.dtype)  # once per step: the class means and the weights read it
        per_class, present = class_means(c, batch.y, counts), counts > 0
        self.q.copy_(chi2_simplex_weights(per_class, present, self.hp("alpha")))
        self.stepped = True
        return class_mean_weights(self.q, batch.y, counts)

    def info(self) -> list[dict[str, Any]]:
        if not self.stepped:
            return [{} for _ in range(self.h)]
        return [{"class_weights_last_batch": self.q[i].tolist()} for i in range(self.h)]
