"""Class-wise χ² DRO in the spirit of FairDRO (Jung et al., ICLR 2023), with the classes as the groups."""
from __future__ import annotations

from typing import Any

import torch

from ._base import METHODS, Batch, Method, per_head_ce
from ._classwise import class_means


@METHODS.register("fair_dro", help="χ²-DRO over classes = mean + α·std of class losses (after Jung et al., "
                  "ICLR 2023)")
class FairDRO(Method):
    """ℓ = mean_k ℓ_k + α · sqrt( mean_k (ℓ_k − ℓ̄)² ),   ℓ_k = mean CE over the batch samples of class k,
    with mean_k, ℓ̄ and the variance taken over the classes present in the batch (population variance).

    Exact variant [choice]: this is the closed form of the χ²-constrained DRO over class weights
        max { Σ_k q_k ℓ_k : Σ_k q_k = 1,  (1/K) Σ_k (K q_k − 1)² ≤ α² },
    attained at q_k = (1 + α (ℓ_k − ℓ̄)/σ) / K (Cauchy–Schwarz); FairDRO's re-weighting view (its χ² ball,
    closed-form q, one gradient step per update) with the sensitive groups replaced by the classes. The
    maximiser lies in the simplex (q_k ≥ 0) whenever α (ℓ̄ − ℓ_k) ≤ σ for every k (always for α ≤ 1/√(K−1));
    otherwise the value is that of the signed-weight ball, an upper bound on the simplex-constrained one.
    Gradients flow through σ, so the class losses are pulled together. σ is floored at 1e-6 (gradient 0
    below it) so that equal class losses give a finite gradient.

    Hyperparameters: ``alpha`` α, the radius (default 0.5; grid 0.5, 1)."""

    defaults: dict[str, Any] = {"alpha": 0.5}
    grid: dict[str, list] = {"alpha": [0.5, 1.0]}

    def loss(self, batch: Batch) -> torch.Tensor:
        per_class, present = class_means(per_head_ce(batch.logits, batch.y), batch.y, self.ctx.num_classes)
        mask = present.to(per_class.dtype)
        n = mask.sum()
        mean = (per_class * mask).sum(1) / n
        var = (((per_class - mean[:, None]) ** 2) * mask).sum(1) / n
        return mean + self.hp("alpha") * var.clamp_min(1e-12).sqrt()
