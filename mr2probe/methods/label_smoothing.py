"""Label smoothing (Szegedy et al., CVPR 2016)."""
from __future__ import annotations

from typing import Any

from ..losses import Terms
from ._base import METHODS, Method


@METHODS.register("label_smoothing", help="CE against (1 − ε)·one-hot + ε/K (Szegedy et al., CVPR 2016)")
class LabelSmoothing(Method):
    """ℓ = −Σ_k q_k log softmax(z)_k,  q = (1 − ε)·e_y + ε/K
         = (1 − ε)·CE(z, y) + ε · mean_k(−log softmax(z)_k);  batch mean.

    Hyperparameters: ``eps`` ε (default 0.1). ε = 0 is plain CE."""

    defaults: dict[str, Any] = {"eps": 0.1}
    grid: dict[str, list] = {}

    def stateless(self) -> bool:
        return True

    def terms(self) -> Terms:
        return Terms(smoothing=self.hp("eps"))
