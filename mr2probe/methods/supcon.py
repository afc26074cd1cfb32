"""Supervised contrastive learning (Khosla et al., NeurIPS 2020) on a trainable adapter, one stage."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ._base import METHODS, Batch, Method


def supcon_loss(z: torch.Tensor, y: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """L_out of Khosla et al. per head: z [h, B, d] (normalised here), y [B], temperature [h] → [h].

    For an anchor i with positives P(i) = {p ≠ i : y_p = y_i} and A(i) = {a ≠ i}:
        ℓ_i = −(1/|P(i)|) Σ_{p∈P(i)} log( exp(z_i·z_p/T) / Σ_{a∈A(i)} exp(z_i·z_a/T) ),
    averaged over the anchors with |P(i)| ≥ 1 (0 when there are none). One masked B×B matrix per head."""
    z = F.normalize(z, dim=-1)
    sim = torch.bmm(z, z.transpose(1, 2)) / temperature[:, None, None]  # [h, B, B]
    eye = torch.eye(len(y), dtype=torch.bool, device=y.device)
    log_prob = sim - torch.logsumexp(sim.masked_fill(eye, float("-inf")), dim=-1, keepdim=True)
    pos = (y[:, None] == y[None, :]) & ~eye  # [B, B]
    n_pos = pos.sum(1)
    anchors = (n_pos > 0).to(z.dtype)  # masks, not a selection: no host sync
    mean_pos = log_prob.masked_fill(~pos, 0.0).sum(-1) / n_pos.clamp_min(1)  # [h, B]
    return -(mean_pos * anchors).sum(1) / anchors.sum().clamp_min(1)


@METHODS.register("supcon", help="supervised contrastive loss on the adapter + CE head on the detached "
                  "representation (Khosla et al., NeurIPS 2020); needs --adapter")
class SupCon(Method):
    """ℓ = L_SupCon(g(x)/‖g(x)‖, T) + CE(h(sg[g(x)]), y),  T = 0.1, sg = stop-gradient.

    The adapter g is trained only by the supervised contrastive loss (``detach_head_input``), the head only by
    CE on the detached representation. This is the one-stage (joint) variant of the paper's "SupCon, then a
    linear classifier on the frozen representation" [choice]: both terms are minimised together, so the head
    keeps up with a moving representation. With cached features there is one view per sample (no
    augmentations): positives are the other same-class samples of the batch. The contrastive loss reads the
    representation the classifier sees (for a cosine head already normalised; normalising again is a no-op).

    Hyperparameters: ``temperature`` T (default 0.1)."""

    defaults: dict[str, Any] = {"temperature": 0.1}
    grid: dict[str, list] = {}
    needs_adapter = True
    detach_head_input = True

    def extra_loss(self, batch: Batch) -> torch.Tensor:
        """The contrastive term; the CE term is the loss form with no term declared."""
        return supcon_loss(batch.rep.expand(self.h, -1, -1), batch.y, self.hp("temperature"))
