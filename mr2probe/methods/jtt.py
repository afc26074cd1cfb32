"""Just Train Twice (Liu et al., ICML 2021)."""
from __future__ import annotations

from typing import Any

import torch

from ..errors import UserError
from ._base import METHODS, Batch, Method


@METHODS.register("jtt", help="just train twice: ERM for T (epochs//3) epochs, then a fresh head with its training "
                  "errors ×λ_up (Liu et al., ICML 2021); loss weights, not upsampling; stage 1 shares the head's lr/wd")
class JTT(Method):
    """Stage 1 (in ``prepare``): an ERM probe (method ``ce``, same lr and weight decay as the head, same seed,
    fresh initialisation) trained for T epochs; error set E = training samples it misclassifies.
    Stage 2 (the head itself, trained from its own fresh initialisation):
        ℓ = Σ_batch w_i · CE(z_i, y_i) / (B · w̄),   w_i = λ_up if i ∈ E else 1,   w̄ = mean of w over the train set,
    so the expected batch loss is exactly the mean CE over the paper's upsampled training set (E repeated λ_up
    times). Deviations [choice]: upweighting in the loss replaces upsampling (the same objective, but the
    epoch length and step count stay those of the original set, and a batch holds E's samples once each);
    stage 1 uses the head's lr and weight decay (the paper tunes both stages' separately).

    Hyperparameters: ``lam_up`` λ_up (default 5; grid 5, 20), ``stage1_epochs`` T (default 0, meaning
    max(1, epochs // 3) [choice]). Heads that share (lr, weight decay, T) share one stage-1 probe."""

    defaults: dict[str, Any] = {"lam_up": 5.0, "stage1_epochs": 0}
    grid: dict[str, list] = {"lam_up": [5.0, 20.0]}

    @classmethod
    def check(cls, hp: dict[str, Any]) -> None:
        if not hp["lam_up"] >= 1:
            raise UserError(f"lam_up must be ≥ 1, got {hp['lam_up']}")
        if not hp["stage1_epochs"] >= 0:
            raise UserError(f"stage1_epochs must be ≥ 0 (0 = epochs // 3), got {hp['stage1_epochs']}")

    def stage1_epochs(self) -> list[int]:
        return [int(hp["stage1_epochs"]) or max(1, self.ctx.schedule.epochs // 3) for hp in self.hparams]

    def prepare(self) -> None:
        epochs = self.stage1_epochs()
        keys = [(float(hp["lr"]), float(hp["weight_decay"]), t) for hp, t in zip(self.hparams, epochs)]
        y = self.ctx.data.y
        wrong = torch.zeros(self.h, len(y), dtype=torch.bool, device=y.device)
        for t in sorted(set(epochs)):
            distinct = sorted({k for k in keys if k[2] == t})
            logits = self.ctx.aux.train("ce", [{"lr": lr, "weight_decay": wd} for lr, wd, _ in distinct], t)
            errors = logits.argmax(-1) != y  # [len(distinct), N]
            rows = [i for i, k in enumerate(keys) if k[2] == t]
            wrong[rows] = errors[[distinct.index(keys[i]) for i in rows]]
        self.error_set = wrong  # [h, N]: the samples stage 1 got wrong
        up = self.hp("lam_up")[:, None]
        self.weights = torch.where(wrong, up, torch.ones_like(up))  # [h, N]
        self.mean_weight = self.weights.mean(1)  # w̄ [h]: 1 + (λ_up − 1)|E|/N
        self.scaled = self.weights / self.mean_weight[:, None]  # w_i / w̄, read every step
        self.epochs1 = epochs

    reweights = True

    def sample_weights(self, c: torch.Tensor, batch: Batch, c_aux: torch.Tensor | None) -> torch.Tensor:
        return self.scaled.index_select(1, batch.idx)  # w_i / w̄ [h, B] (a gather of columns, cheaper than [:, idx])

    def info(self) -> list[dict[str, Any]]:
        n = len(self.ctx.data.y)
        return [{"jtt_error_set_size": int(self.error_set[i].sum()), "jtt_stage1_epochs": self.epochs1[i],
                 "jtt_stage1_train_acc": 1 - float(self.error_set[i].sum()) / n} for i in range(self.h)]
