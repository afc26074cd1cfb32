"""Class-wise difficulty-balanced loss (Sinha et al., ACCV 2020)."""
from __future__ import annotations

from typing import Any

import torch

from ._base import METHODS, Batch, Method, per_head_ce
from ._classwise import per_class_accuracy


@METHODS.register("cdb", help="CE weighted by class difficulty (1 − val acc_k)^τ, updated every epoch "
                  "(Sinha et al., ACCV 2020)")
class CDB(Method):
    """ℓ = mean over the batch of w_y · CE(z, y),   w_k = d_k^τ / mean_j d_j^τ  (mean weight 1),
         d_k = max(1 − acc_k, d_min)   with acc_k the head's accuracy on class k of the validation split.

    The weights of every head are recomputed from its own predictions at the start of each epoch (epoch 0:
    the initial head). Fixed τ (the paper's "dynamic τ" schedule is not used). d_min (default 0.01) keeps a
    perfectly classified class from getting weight 0 and the all-perfect case finite [choice]. A class with
    no validation sample gets the mean d^τ of the others before normalising [choice].

    Hyperparameters: ``tau`` τ (default 1), ``min_difficulty`` d_min (default 0.01)."""

    defaults: dict[str, Any] = {"tau": 1.0, "min_difficulty": 0.01}
    grid: dict[str, list] = {}

    def on_epoch_start(self, epoch: int) -> None:
        acc, present = per_class_accuracy(self.ctx.predict(self.ctx.val_x), self.ctx.val_y, self.ctx.num_classes)
        self.val_acc = acc
        self.weights = difficulty_weights(acc, present, self.hp("tau"), self.hp("min_difficulty"))

    def loss(self, batch: Batch) -> torch.Tensor:
        return (self.weights[:, batch.y] * per_head_ce(batch.logits, batch.y)).mean(1)

    def info(self) -> list[dict[str, Any]]:
        return [{"class_weights": self.weights[i].tolist(), "cdb_val_class_acc": self.val_acc[i].tolist()}
                for i in range(self.h)]


def difficulty_weights(acc: torch.Tensor, present: torch.Tensor, tau: torch.Tensor, min_d: torch.Tensor
                       ) -> torch.Tensor:
    """w = max(1 − acc, d_min)^τ normalised to mean 1 over classes: acc [h, K], present [K], τ, d_min [h]."""
    w = torch.maximum(1 - acc, min_d[:, None]).pow(tau[:, None])
    fill = (w * present).sum(1, keepdim=True) / present.sum().clamp_min(1)
    w = torch.where(present[None, :], w, fill)
    return w / w.mean(1, keepdim=True)
