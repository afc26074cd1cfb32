"""Focal loss (Lin et al., ICCV 2017)."""
from __future__ import annotations

from typing import Any

import torch

from ._base import METHODS, Batch, Method, per_head_ce


@METHODS.register("focal", help="focal loss (1 − p_y)^γ · CE (Lin et al., ICCV 2017)")
class Focal(Method):
    """ℓ = (1 − p_y)^γ · CE(z, y),  p_y = softmax(z)_y = exp(−CE); batch mean. γ = 0 is plain CE.

    Hyperparameters: ``gamma`` γ (default 2, the paper's choice). No α class-balancing factor (the paper's
    α-balanced variant is a class reweighting; class_balanced covers that)."""

    defaults: dict[str, Any] = {"gamma": 2.0}
    grid: dict[str, list] = {}

    def stateless(self) -> bool:
        return True

    def loss(self, batch: Batch) -> torch.Tensor:
        ce = per_head_ce(batch.logits, batch.y)  # [h, B]
        modulator = (-torch.expm1(-ce)).clamp_min(0).pow(self.hp("gamma")[:, None])  # (1 − p_y)^γ
        return (modulator * ce).mean(1)
