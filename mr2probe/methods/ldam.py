"""LDAM: label-distribution-aware margin loss (Cao et al., NeurIPS 2019)."""
from __future__ import annotations

from typing import Any

import torch

from ._base import METHODS, Batch, Method, per_head_ce


def ldam_margins(counts: torch.Tensor, max_m: torch.Tensor) -> torch.Tensor:
    """Δ_k = max_m · n_k^(−1/4) / max_j n_j^(−1/4): counts [K], max_m [h] → [h, K] (largest Δ = max_m)."""
    base = counts.clamp_min(1).pow(-0.25)
    return max_m[:, None] * (base / base.max())[None, :]


@METHODS.register("ldam", help="LDAM: CE(s·(z − Δ_y e_y)), Δ_k ∝ n_k^(−1/4) (Cao et al., NeurIPS 2019)")
class LDAM(Method):
    """ℓ = CE(s · (ẑ − Δ_y e_y), y),  Δ_k = max_m · n_k^(−1/4) / max_j n_j^(−1/4)   (batch mean).

    The rare classes get the largest margin; on a balanced training set every Δ_k = max_m (a constant
    margin for the true class). No deferred re-weighting (LDAM-DRW is not this method).

    How it combines with the probe heads [choice]:
    - ``cosine`` head: its logits are s_head · cos θ_k with s_head = ``--scale``. LDAM uses the normalised
      logits ẑ = z / s_head = cos θ and its own scale ``s`` (default 30), i.e. s·(cos θ − Δ_y e_y): exactly
      the paper's normalised-classifier form. With ``--learn-scale`` the head's learned factor
      s_learned / s_head multiplies cos θ inside the bracket (LDAM's effective scale is then learned,
      starting at ``s``).
    - ``linear`` head: unnormalised logits have no fixed scale, so ``s`` is not applied; ẑ = z and the scale is
      ``s_linear`` (default 1): CE(z − Δ_y e_y), a margin of max_m logit units for the rarest class.

    Hyperparameters: ``max_m`` (0.5), ``s`` (30, cosine heads), ``s_linear`` (1, linear heads)."""

    defaults: dict[str, Any] = {"max_m": 0.5, "s": 30.0, "s_linear": 1.0}
    grid: dict[str, list] = {}

    def prepare(self) -> None:
        self.delta = ldam_margins(self.ctx.counts, self.hp("max_m"))  # [h, K]
        if self.ctx.probe.head == "cosine":
            self.pre, self.scale = 1.0 / self.ctx.probe.scale, self.hp("s")
        else:
            self.pre, self.scale = 1.0, self.hp("s_linear")

    def loss(self, batch: Batch) -> torch.Tensor:
        onehot = torch.nn.functional.one_hot(batch.y, self.ctx.num_classes).to(batch.logits.dtype)  # [B, K]
        shifted = batch.logits * self.pre - self.delta[:, batch.y, None] * onehot  # [h, B, K]
        return per_head_ce(self.scale[:, None, None] * shifted, batch.y).mean(1)

    def info(self) -> list[dict[str, Any]]:
        return [{"ldam_margins": self.delta[i].tolist()} for i in range(self.h)]
