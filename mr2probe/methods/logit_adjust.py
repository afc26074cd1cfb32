"""Logit-adjusted loss (Menon et al., ICLR 2021)."""
from __future__ import annotations

from typing import Any

from ..losses import Terms
from ._base import METHODS, Method


@METHODS.register("logit_adjust", help="logit-adjusted CE: CE(z + τ log π) (Menon et al., ICLR 2021)")
class LogitAdjust(Method):
    """ℓ = CE(z + τ · log π, y),  π_k = n_k / N the training prior;  batch mean. Predictions stay argmax z.

    On a balanced training set log π is the same for every class and the loss equals CE exactly (softmax is
    shift-invariant). Hyperparameters: ``tau`` τ (default 1, the Fisher-consistent choice for balanced error)."""

    defaults: dict[str, Any] = {"tau": 1.0}
    grid: dict[str, list] = {}

    def prepare(self) -> None:
        counts = self.ctx.data.counts
        self.log_prior = (counts / counts.sum()).clamp_min(1e-12).log()  # [K]

    def stateless(self) -> bool:
        return True

    def terms(self) -> Terms:
        return Terms(offset=self.hp("tau")[:, None] * self.log_prior)  # o = τ log π
