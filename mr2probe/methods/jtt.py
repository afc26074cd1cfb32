"""Just Train Twice (Liu et al., ICML 2021)."""
from __future__ import annotations

from typing import Any

import torch

from ._base import METHODS, Batch, Method, per_head_ce


@METHODS.register("jtt", help="just train twice: ERM for T epochs, then CE with its training errors upweighted "
                  "by λ_up (Liu et al., ICML 2021)")
class JTT(Method):
    """Stage 1 (in ``prepare``): an ERM probe (method ``ce``, same lr and weight decay as the head, same seed,
    fresh initialisation) trained for T epochs; error set E = training samples it misclassifies.
    Stage 2 (the head itself): ℓ = mean over the batch of w_i · CE(z_i, y_i),  w_i = λ_up if i ∈ E else 1
    (batch averaged over its size B). Upweighting in the loss replaces the paper's upsampling of E
    (the same objective in expectation) [choice].

    Hyperparameters: ``lam_up`` λ_up (default 5; grid 5, 20), ``stage1_epochs`` T (default 0, meaning
    max(1, epochs // 3) [choice]). Heads that share (lr, weight decay, T) share one stage-1 probe."""

    defaults: dict[str, Any] = {"lam_up": 5.0, "stage1_epochs": 0}
    grid: dict[str, list] = {"lam_up": [5.0, 20.0]}

    def stage1_epochs(self) -> list[int]:
        return [int(hp["stage1_epochs"]) or max(1, self.ctx.epochs // 3) for hp in self.hparams]

    def prepare(self) -> None:
        epochs = self.stage1_epochs()
        keys = [(float(hp["lr"]), float(hp["weight_decay"]), t) for hp, t in zip(self.hparams, epochs)]
        wrong = torch.zeros(self.h, len(self.ctx.y), dtype=torch.bool, device=self.ctx.y.device)
        for t in sorted(set(epochs)):
            distinct = sorted({k for k in keys if k[2] == t})
            logits = self.ctx.train_aux("ce", [{"lr": lr, "weight_decay": wd} for lr, wd, _ in distinct], t)
            errors = logits.argmax(-1) != self.ctx.y  # [len(distinct), N]
            rows = [i for i, k in enumerate(keys) if k[2] == t]
            wrong[rows] = errors[[distinct.index(keys[i]) for i in rows]]
        self.error_set = wrong  # [h, N]: the samples stage 1 got wrong
        up = self.hp("lam_up")[:, None]
        self.weights = torch.where(wrong, up, torch.ones_like(up))  # [h, N]
        self.epochs1 = epochs

    def loss(self, batch: Batch) -> torch.Tensor:
        return (self.weights[:, batch.idx] * per_head_ce(batch.logits, batch.y)).mean(1)

    def info(self) -> list[dict[str, Any]]:
        n = len(self.ctx.y)
        return [{"jtt_error_set_size": int(self.error_set[i].sum()), "jtt_stage1_epochs": self.epochs1[i],
                 "jtt_stage1_train_acc": 1 - float(self.error_set[i].sum()) / n} for i in range(self.h)]
