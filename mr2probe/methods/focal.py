"""Focal loss (Lin et al., ICCV 2017)."""
from __future__ import annotations

from typing import Any

from ..losses import Terms
from ._base import METHODS, Method


@METHODS.register("focal", help="focal loss (1 − p_y)^γ · CE (Lin et al., ICCV 2017)")
class Focal(Method):
    """ℓ = (1 − p_y)^γ · CE(z, y),  p_y = softmax(z)_y = exp(−CE); batch mean. γ = 0 is plain CE.

    Hyperparameters: ``gamma`` γ (default 2, the paper's choice). No α class-balancing factor (the paper's
    α-balanced variant is a class reweighting; class_balanced covers that)."""

    defaults: dict[str, Any] = {"gamma": 2.0}
    grid: dict[str, list] = {}

    def stateless(self) -> bool:
        return True

    def terms(self) -> Terms:
        return Terms(focal=self.hp("gamma"))  # ψ(c) = (1 − e^{−c})^γ c
