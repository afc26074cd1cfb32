"""Logit-adjusted loss (Menon et al., ICLR 2021)."""
from __future__ import annotations

from typing import Any

import torch

from ._base import METHODS, Batch, Method, per_head_ce


@METHODS.register("logit_adjust", help="logit-adjusted CE: CE(z + τ log π) (Menon et al., ICLR 2021)")
class LogitAdjust(Method):
    """ℓ = CE(z + τ · log π, y),  π_k = n_k / N the training prior;  batch mean. Predictions stay argmax z.

    On a balanced training set log π is the same for every class and the loss equals CE exactly (softmax is
    shift-invariant). Hyperparameters: ``tau`` τ (default 1, the Fisher-consistent choice for balanced error)."""

    defaults: dict[str, Any] = {"tau": 1.0}
    grid: dict[str, list] = {}

    def prepare(self) -> None:
        counts = self.ctx.counts
        self.log_prior = (counts / counts.sum()).clamp_min(1e-12).log()  # [K]

    def stateless(self) -> bool:
        return True

    def loss(self, batch: Batch) -> torch.Tensor:
        adjusted = batch.logits + self.hp("tau")[:, None, None] * self.log_prior
        return per_head_ce(adjusted, batch.y).mean(1)
