"""Class-wise difficulty-balanced loss (Sinha et al., ACCV 2020)."""
from __future__ import annotations

from typing import Any

import torch

from ..errors import UserError
from ..losses import Terms
from ._base import METHODS, Batch, Method

CHUNK = 8192  # rows per no-grad evaluation chunk
HOLDOUT_SALT = 7919  # the held-out part is drawn from a generator seeded by run seed + this


def stratified_holdout(y: torch.Tensor, num_classes: int, frac: torch.Tensor, seed: int) -> torch.Tensor:
    """Held-out mask [h, N]: per class k the first m_k = min(⌈frac · n_k⌉, n_k − 1) samples of one seeded random
    order (so every class with ≥ 2 samples keeps ≥ 1 for training and gives ≥ 1 for measuring); frac [h]."""
    n = len(y)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + HOLDOUT_SALT)).to(y.device)
    order = perm[torch.sort(y[perm], stable=True).indices]  # grouped by class, random within a class
    counts = torch.bincount(y, minlength=num_classes)
    start = counts.cumsum(0) - counts
    rank = torch.empty_like(y)
    rank[order] = torch.arange(n, device=y.device) - start[y[order]]  # position of each sample within its class
    m = torch.minimum(torch.ceil(frac[:, None] * counts[None, :].to(frac.dtype)), (counts - 1)[None, :])  # [h, K]
    return rank[None, :] < m[:, y]


def dynamic_tau(acc: torch.Tensor, present: torch.Tensor, eps: float = 0.01) -> torch.Tensor:
    """The paper's dynamic τ = 2·σ(b), b = max_k A_k / (min_k A_k + ε) − 1 over the measured classes: [h]."""
    hi = acc.masked_fill(~present, -torch.inf).amax(1)
    lo = acc.masked_fill(~present, torch.inf).amin(1)
    tau = 2 * torch.sigmoid(hi / (lo + eps) - 1)
    return torch.where(present.any(1), tau, torch.ones_like(tau))  # nothing measured: τ = 1


def difficulty_weights(acc: torch.Tensor, present: torch.Tensor, tau: torch.Tensor, min_d: torch.Tensor
                       ) -> torch.Tensor:
    """w = max(1 − acc, d_min)^τ normalised to mean 1 over classes: acc [h, K], present [K] or [h, K], τ, d_min [h].
    A class without a measured sample gets the mean d^τ of the measured ones before normalising."""
    present = present.expand_as(acc)
    w = torch.maximum(1 - acc, min_d[:, None]).pow(tau[:, None])
    fill = (w * present).sum(1, keepdim=True) / present.sum(1, keepdim=True).clamp_min(1)
    w = torch.where(present, w, fill)
    w = torch.where(present.any(1, keepdim=True), w, torch.ones_like(w))  # nothing measured: uniform
    return w / w.mean(1, keepdim=True)


@METHODS.register("cdb", help="CDB: CE weighted by max(1 − acc_k, 0.01)^τ, dynamic τ, acc_k re-measured each epoch on a"
                  " seeded class-stratified 20% of train held out of the loss (Sinha et al., ACCV 2020)")
class CDB(Method):
    """ℓ = mean over the batch of keep_i · w_y · CE(z, y),   w_k = d_k^τ / mean_j d_j^τ  (mean weight 1),
         d_k = max(1 − acc_k, d_min),   acc_k = the head's accuracy on class k of the measuring set.

    Measuring set [choice], ``acc_on``: never the selection val split.
    - ``holdout`` (default): a class-stratified part of the training set, drawn once from the run seed: per
      class m_k = min(⌈``holdout_frac`` · n_k⌉, n_k − 1) samples (``holdout_frac`` 0.2). They are held out of
      CDB's loss by keep_i = 0 (the batch is still averaged over its size B), as the authors carve their
      class-balanced validation set out of the training data. A class with a single sample is not measured.
    - ``train``: the whole training set, every sample in the loss (keep_i = 1).
    Weights are 1 in epoch 0 (the paper starts from uniform difficulty), then recomputed at the start of every
    epoch from the head's current predictions (after each epoch, as in the paper).

    τ: ``dynamic_tau`` (default true, the paper's) sets τ = 2·σ(max_k acc_k / (min_k acc_k + 0.01) − 1) per head
    and epoch (τ = 1 for equal accuracies, → 2 for very unequal ones); false uses the fixed ``tau``. d_min
    (default 0.01) keeps a perfectly classified class from getting weight 0 and the all-perfect case finite
    [choice; the paper has no floor]. A class with no measured sample gets the mean d^τ of the others before
    normalising [choice]. The authors' code divides the weighted batch by Σ_batch w_y, here by B.

    Hyperparameters: ``tau`` τ (1, if not dynamic), ``dynamic_tau`` (true), ``min_difficulty`` d_min (0.01),
    ``acc_on`` (holdout | train), ``holdout_frac`` (0.2)."""

    defaults: dict[str, Any] = {"tau": 1.0, "dynamic_tau": True, "min_difficulty": 0.01, "acc_on": "holdout",
                                "holdout_frac": 0.2}
    grid: dict[str, list] = {}

    @classmethod
    def check(cls, hp: dict[str, Any]) -> None:
        rules = {"tau": (hp["tau"] >= 0, "≥ 0"), "min_difficulty": (0 < hp["min_difficulty"] <= 1, "in (0, 1]"),
                 "holdout_frac": (0 < hp["holdout_frac"] < 1, "in (0, 1)")}
        for key, (ok, need) in rules.items():
            if not ok:
                raise UserError(f"{key} must be {need}, got {hp[key]}")
        if hp["acc_on"] not in ("holdout", "train"):
            raise UserError(f"acc_on must be holdout or train, got {hp['acc_on']!r}")

    def prepare(self) -> None:
        data = self.ctx.data
        holdout = torch.tensor([hp["acc_on"] == "holdout" for hp in self.hparams], device=data.y.device)
        held = stratified_holdout(data.y, data.num_classes, self.hp("holdout_frac"), self.ctx.schedule.seed) \
            & holdout[:, None]
        self.measure = torch.where(holdout[:, None], held, torch.ones_like(held))  # [h, N]: rows acc_k is taken on
        self.keep = (~held).to(data.dtype)  # [h, N]: 0 for the held-out rows
        self.rows = torch.nonzero(self.measure.any(0)).flatten()  # rows any head measures on
        self.weights = torch.ones(self.h, data.num_classes, dtype=data.dtype, device=data.device)
        self.acc, self.measured = self.weights.clone(), torch.zeros_like(self.weights, dtype=torch.bool)
        self.tau = self.hp("tau")

    @torch.no_grad()
    def class_accuracy(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each head's accuracy on each class of its measuring set → (acc [h, K], measured [h, K] bool)."""
        data, k = self.ctx.data, self.ctx.data.num_classes
        hits = torch.zeros(self.h, k, dtype=data.dtype, device=data.device)
        total = torch.zeros_like(hits)
        if isinstance(data.x, torch.Tensor):  # in memory: only the measured rows
            chunks = [(idx, data.x[idx]) for idx in self.rows.split(CHUNK)]
        else:  # streamed: contiguous slices only
            c = min(CHUNK, getattr(data.x, "block_rows", CHUNK))
            chunks = ((torch.arange(i, min(i + c, len(data.y)), device=data.y.device), data.x[i:i + c])
                      for i in range(0, len(data.y), c))
        for idx, xb in chunks:
            y = data.y[idx]
            onehot = torch.nn.functional.one_hot(y, k).to(hits.dtype)
            m = self.measure[:, idx]
            hits += ((self.ctx.heads.predict(xb).argmax(-1) == y) & m).to(hits.dtype) @ onehot
            total += m.to(hits.dtype) @ onehot
        return hits / total.clamp_min(1), total > 0

    def on_epoch_start(self, epoch: int) -> None:
        if epoch == 0:
            return  # uniform weights for the first epoch
        acc, measured = self.class_accuracy()
        dynamic = self.hp("dynamic_tau") > 0
        self.acc, self.measured = acc, measured
        self.tau = torch.where(dynamic, dynamic_tau(acc, measured), self.hp("tau"))
        self.weights.copy_(difficulty_weights(acc, measured, self.tau, self.hp("min_difficulty")))

    def terms(self) -> Terms:
        return Terms(class_weight=self.weights)

    reweights = True

    def sample_weights(self, c: torch.Tensor, batch: Batch, c_aux: torch.Tensor | None) -> torch.Tensor:
        """keep_i: 0 for the rows held out to measure acc_k."""
        return self.keep.index_select(1, batch.idx)

    def info(self) -> list[dict[str, Any]]:
        held = (1 - self.keep).sum(1)
        acc = [[a if ok else None for a, ok in zip(self.acc[i].tolist(), self.measured[i].tolist())]
               for i in range(self.h)]  # None: not measured (yet)
        return [{"class_weights": self.weights[i].tolist(), "cdb_class_acc": acc[i],
                 "cdb_tau": float(self.tau[i]), "cdb_holdout_size": int(held[i])} for i in range(self.h)]
