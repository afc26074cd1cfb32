"""Equalization loss, v1 (Tan et al., CVPR 2020)."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ._base import METHODS, Batch, Method


@METHODS.register("eql", help="equalization loss: sigmoid CE without negative terms of rare classes (Tan et al., "
                  "CVPR 2020)")
class EQL(Method):
    """ℓ = −Σ_k w_k [ t_k log σ(z_k) + (1 − t_k) log(1 − σ(z_k)) ],  t = e_y (one-vs-all sigmoid CE),
         w_k = 1 − T(π_k) · (1 − t_k),   T(π_k) = 1 if π_k < λ else 0;   sum over classes, batch mean.

    So a rare class k (training frequency π_k = n_k/N below λ) receives no negative ("suppressing") gradient
    from the samples of other classes; its own samples still give it a positive term. EQL v1 without the
    background exclusion E(r) (there is no background class here). Predictions stay argmax z.

    λ is given relative to the balanced share [choice]: λ = ``lam_rel`` / K, default ``lam_rel`` = 0.5, i.e.
    classes with less than half the average class frequency are "rare". On a balanced training set no
    class is rare and the loss is plain one-vs-all sigmoid CE."""

    defaults: dict[str, Any] = {"lam_rel": 0.5}
    grid: dict[str, list] = {}

    def prepare(self) -> None:
        counts = self.ctx.counts
        prior = counts / counts.sum()  # π [K]
        self.rare = prior[None, :] < self.hp("lam_rel")[:, None] / self.ctx.num_classes  # [h, K]

    def loss(self, batch: Batch) -> torch.Tensor:
        target = F.one_hot(batch.y, self.ctx.num_classes).to(batch.logits.dtype)  # [B, K]
        bce = F.binary_cross_entropy_with_logits(batch.logits, target.expand_as(batch.logits), reduction="none")
        drop = self.rare[:, None, :] & (target == 0)[None]  # [h, B, K]: negative terms of rare classes
        return bce.masked_fill(drop, 0.0).sum(-1).mean(1)

    def info(self) -> list[dict[str, Any]]:
        return [{"eql_rare_classes": torch.nonzero(self.rare[i]).flatten().tolist()} for i in range(self.h)]
