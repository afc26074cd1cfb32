"""Equalization loss, v1 (Tan et al., CVPR 2020)."""
from __future__ import annotations

from typing import Any

import torch

from ..errors import UserError
from ..losses import Terms
from ._base import METHODS, Method


@METHODS.register("eql", help="equalization loss (sigmoid form): one-vs-all sigmoid CE without the negative terms "
                  "of classes with π_k < λ = lam_rel/K (Tan et al., CVPR 2020); no softmax EQL, no E(r)")
class EQL(Method):
    """ℓ = −Σ_k w_k [ t_k log σ(z_k) + (1 − t_k) log(1 − σ(z_k)) ],  t = e_y (one-vs-all sigmoid CE),
         w_k = 1 − T(π_k) · (1 − t_k),   T(π_k) = 1 if π_k < λ else 0;   sum over classes, batch mean.

    So a rare class k (training frequency π_k = n_k/N below λ) receives no negative ("suppressing") gradient
    from the samples of other classes; its own samples still give it a positive term. This is the paper's
    EQL (its Eq. for sigmoid classifiers) with E(r) = 1: there is no background class here. For a single-label
    set the paper's category frequency (images containing k / images) is π_k. Predictions stay argmax z.

    λ is given relative to the balanced share [choice]: λ = ``lam_rel`` / K, default ``lam_rel`` = 0.5, i.e.
    classes with less than half the average class frequency are "rare" (the paper sets an absolute λ from its
    tail-ratio ablation). On a balanced training set no class is rare and the loss is plain one-vs-all sigmoid
    CE. Not implemented: the paper's softmax variant for image classification (SEQL: rare negatives dropped
    from the softmax denominator, each time with probability γ)."""

    defaults: dict[str, Any] = {"lam_rel": 0.5}
    grid: dict[str, list] = {}

    @classmethod
    def check(cls, hp: dict[str, Any]) -> None:
        if not hp["lam_rel"] >= 0:
            raise UserError(f"lam_rel must be ≥ 0, got {hp['lam_rel']}")

    def prepare(self) -> None:
        counts = self.ctx.data.counts
        prior = counts / counts.sum()  # π [K]
        self.rare = prior[None, :] < self.hp("lam_rel")[:, None] / self.ctx.data.num_classes  # [h, K]

    def stateless(self) -> bool:
        return True

    def terms(self) -> Terms:
        return Terms(sigmoid=True, negatives_dropped=self.rare)  # the loss form's sigmoid mode

    def info(self) -> list[dict[str, Any]]:
        return [{"eql_rare_classes": torch.nonzero(self.rare[i]).flatten().tolist()} for i in range(self.h)]
