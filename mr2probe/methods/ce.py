"""Plain cross-entropy (ERM): the reference every disparity is measured against."""
from __future__ import annotations

import torch

from ._base import METHODS, Batch, Method, per_head_ce


@METHODS.register("ce", help="cross-entropy (ERM), the reference method")
class CrossEntropy(Method):
    """ℓ = −log softmax(f(x))_y."""

    def stateless(self) -> bool:
        return True

    def loss(self, batch: Batch) -> torch.Tensor:
        return per_head_ce(batch.logits, batch.y).mean(1)
