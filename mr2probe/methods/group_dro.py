"""Group DRO with classes as groups (Sagawa et al., ICLR 2020)."""
from __future__ import annotations

from typing import Any

import torch

from ._base import METHODS, Batch, Method, per_head_ce
from ._classwise import class_means


@METHODS.register("group_dro", help="group DRO over classes: q_k ← q_k·exp(η ℓ_k), minimise Σ q_k ℓ_k "
                  "(Sagawa et al., ICLR 2020)")
class GroupDRO(Method):
    """Online group DRO (the paper's Algorithm 1) with the K classes as the groups. Every step, per head:
         ℓ_k = mean CE over the batch samples of class k,
         q_k ← q_k · exp(η · ℓ_k)  (classes absent from the batch keep their q_k), then q ← q / Σ_j q_j,
         loss = Σ_k q_k ℓ_k   (q held fixed: no gradient through q; absent classes contribute 0).
    q starts uniform (1/K) and is kept across steps and epochs. No group-size adjustment C/√n_k and no
    extra regularisation of the paper's "generalisation" variant.

    Hyperparameters: ``eta`` η, the step size of q (default 0.01, the paper's)."""

    defaults: dict[str, Any] = {"eta": 0.01}
    grid: dict[str, list] = {}

    def prepare(self) -> None:
        k = self.ctx.num_classes
        self.q = torch.full((self.h, k), 1.0 / k, dtype=self.ctx.x.dtype, device=self.ctx.x.device)

    def loss(self, batch: Batch) -> torch.Tensor:
        per_class, present = class_means(per_head_ce(batch.logits, batch.y), batch.y, self.ctx.num_classes)
        with torch.no_grad():
            q = self.q * torch.exp(self.hp("eta")[:, None] * per_class.detach() * present)
            self.q = q / q.sum(1, keepdim=True)
        return (self.q * per_class).sum(1)

    def info(self) -> list[dict[str, Any]]:
        return [{"group_weights": self.q[i].tolist()} for i in range(self.h)]
