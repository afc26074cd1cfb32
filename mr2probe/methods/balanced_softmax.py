"""Balanced softmax (Ren et al., NeurIPS 2020)."""
from __future__ import annotations

from typing import Any

from ..losses import Terms
from ._base import METHODS, Method


@METHODS.register("balanced_softmax", help="balanced softmax: CE(z + log n) (Ren et al., NeurIPS 2020)")
class BalancedSoftmax(Method):
    """ℓ = CE(z + log n, y) = −log( n_y e^{z_y} / Σ_k n_k e^{z_k} ),  n_k the training counts;  batch mean.

    Same minimiser as logit_adjust with τ = 1 (log n = log π + log N, a constant shift); on a balanced training
    set it equals CE exactly. No hyperparameters."""

    defaults: dict[str, Any] = {}
    grid: dict[str, list] = {}

    def prepare(self) -> None:
        self.log_counts = self.ctx.data.counts.clamp_min(1).log()  # [K]

    def stateless(self) -> bool:
        return True

    def terms(self) -> Terms:
        return Terms(offset=self.log_counts.expand(self.h, -1))  # o = log n
