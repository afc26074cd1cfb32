"""Class-balanced loss by the effective number of samples (Cui et al., CVPR 2019)."""
from __future__ import annotations

from typing import Any

import torch

from ..losses import Terms
from ._base import METHODS, Method


def effective_number_weights(counts: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """w_k = (1 − β) / (1 − β^{n_k}), normalised so that Σ_k w_k = K: counts [K], β [h] → [h, K].

    Computed in float64: with β = 0.9999, 1 − β^{n_k} loses most digits in float32."""
    n = counts.to(torch.float64).clamp_min(1)[None, :]
    b = beta.to(torch.float64)[:, None]
    w = (1 - b) / (1 - b.pow(n))
    return (w * n.shape[1] / w.sum(1, keepdim=True)).to(counts.dtype)


@METHODS.register("class_balanced", help="CE weighted by (1 − β)/(1 − β^n_k) (Cui et al., CVPR 2019)")
class ClassBalanced(Method):
    """ℓ = mean over the batch of w_y · CE(z, y),  w_k = (1 − β)/(1 − β^{n_k}) normalised to Σ_k w_k = K
    (the paper's normalisation; the batch is averaged over its size B, not divided by Σ_batch w_y).

    Softmax-CE variant of the paper (it also pairs the weights with sigmoid and focal losses). On a balanced
    training set every w_k = 1 and the loss is CE. Hyperparameters: ``beta`` β (default 0.9999; grid 0.999, 0.9999)."""

    defaults: dict[str, Any] = {"beta": 0.9999}
    grid: dict[str, list] = {"beta": [0.999, 0.9999]}

    def prepare(self) -> None:
        self.weights = effective_number_weights(self.ctx.data.counts, self.hp("beta"))  # [h, K]

    def stateless(self) -> bool:
        return True

    def terms(self) -> Terms:
        return Terms(class_weight=self.weights)

    def info(self) -> list[dict[str, Any]]:
        return [{"class_weights": self.weights[i].tolist()} for i in range(self.h)]
