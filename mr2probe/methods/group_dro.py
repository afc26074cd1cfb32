"""Group DRO with classes as groups (Sagawa et al., ICLR 2020)."""
from __future__ import annotations

from typing import Any

import torch

from ..errors import UserError
from ..losses import class_mean_weights, class_means, label_counts
from ._base import METHODS, Batch, Method


@METHODS.register("group_dro", help="group DRO, classes as groups: q_k ← q_k·exp(η(ℓ_k + C/√n_k)), minimise "
                  "Σ q_k ℓ_k (Sagawa et al., ICLR 2020); minibatch form of Alg. 1; strong ℓ2 = the wd grid")
class GroupDRO(Method):
    """Online group DRO (the paper's Algorithm 1, in the minibatch form of the authors' code) with the K classes
    as the groups. Every step, per head:
         ℓ_k = mean CE over the batch samples of class k,
         q_k ← q_k · exp(η · (ℓ_k + C/√n_k))  (classes absent from the batch keep their q_k), q ← q / Σ_j q_j,
         loss = Σ_k q_k ℓ_k   (q held fixed: no gradient through q; absent classes contribute 0).
    q starts uniform (1/K) and is kept across steps and epochs. C/√n_k is the paper's group adjustment
    (n_k = training count of class k; C = ``adj``, default 0 = none; the paper tunes C on val). The
    paper's Algorithm 1 samples one group per step; here every class in the batch updates q at once. Its
    "strong ℓ2 penalty / early stopping" is the trainer's weight-decay grid and val selection, not part of
    this loss.

    Hyperparameters: ``eta`` η, the step size of q (default 0.01, the paper's), ``adj`` C (default 0)."""

    defaults: dict[str, Any] = {"eta": 0.01, "adj": 0.0}
    grid: dict[str, list] = {}

    @classmethod
    def check(cls, hp: dict[str, Any]) -> None:
        for key in ("eta", "adj"):
            if not hp[key] >= 0:
                raise UserError(f"{key} must be ≥ 0, got {hp[key]}")

    def prepare(self) -> None:
        k = self.ctx.data.num_classes
        self.q = torch.full((self.h, k), 1.0 / k, dtype=self.ctx.data.dtype, device=self.ctx.data.device)
        self.adjust = self.hp("adj")[:, None] / self.ctx.data.counts.clamp_min(1).sqrt()[None, :]  # [h, K]: C/√n_k

    reweights = True

    @torch.no_grad()
    def sample_weights(self, c: torch.Tensor, batch: Batch, c_aux: torch.Tensor | None) -> torch.Tensor:
        """q ← softmax(log q + η (ℓ_k + C/√n_k) · [k in the batch]) in place (log space: no overflow for large
        η·ℓ), then the weights of Σ_k q_k ℓ_k as a batch mean (:func:`~mr2probe.losses.class_mean_weights`)."""
        k = self.ctx.data.num_classes
        counts = label_counts(batch.y, k, c.dtype)  # once per step: the class means and the weights read it
        per_class, present = class_means(c, batch.y, counts), counts > 0
        step = self.hp("eta")[:, None] * (per_class + self.adjust) * present
        self.q.copy_(torch.softmax(self.q.log() + step, 1))
        return class_mean_weights(self.q, batch.y, counts)

    def info(self) -> list[dict[str, Any]]:
        return [{"group_weights": self.q[i].tolist()} for i in range(self.h)]
