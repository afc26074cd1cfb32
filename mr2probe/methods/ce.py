"""Plain cross-entropy (ERM): the reference every disparity is measured against."""
from __future__ import annotations

from ._base import METHODS, Method


@METHODS.register("ce", help="cross-entropy (ERM), the reference method")
class CrossEntropy(Method):
    """ℓ = −log softmax(f(x))_y: the loss form with no term declared (mr2probe.losses)."""

    def stateless(self) -> bool:
        return True
