"""Learning from Failure (Nam et al., NeurIPS 2020), as a pair of probe heads."""
from __future__ import annotations

from typing import Any

import torch

from ..errors import UserError
from ..losses import Terms
from ._base import METHODS, Batch, Method


@METHODS.register("lff", help="learning from failure: a GCE (q=0.7) biased head reweights the main head's CE by "
                  "ℓ̃_B/(ℓ̃_B+ℓ̃_D), EMA 0.7 (Nam et al., NeurIPS 2020); two heads, not two nets; no class-max norm")
class LfF(Method):
    """Two heads per run: the main (debiased) head D of the probe and a biased head B owned by this method.

    B has the same architecture as the probe's head (linear or cosine: fresh heads the trainer gives it,
    ``ctx.aux.new_heads``), reads the representation detached (it never trains the adapter), is initialised from
    the run seed offset by ``init_seed`` (default 7777, so it starts away from the main head and differs between
    seeds) and is trained with generalized CE:
        ℓ_B = (1 − p_B,y^q) / q,  q = 0.7.
    D is trained with relative-difficulty weights, per sample and detached:
        W(x) = ℓ̃_B(x) / (ℓ̃_B(x) + ℓ̃_D(x)),   ℓ_D = W(x) · CE(f_D(x), y),
    where ℓ̃ are per-sample exponential moving averages of the two CE losses over the sample's visits:
    ℓ̃ ← CE at a sample's first visit, then ℓ̃ ← a·ℓ̃ + (1 − a)·CE, a = ``ema`` (default 0.7, the paper's;
    ``ema`` = 0 uses the current losses), as in the authors' code.
    loss = mean_B ℓ_D + mean_B ℓ_B (disjoint parameters: each head gets only its own gradient).

    Deviations [choice]: the paper's B and D are two whole networks; here they are two heads on one
    representation, and with a trainable adapter only D's loss trains it (B sees it detached). The authors'
    code also divides each ℓ̃ by its class-wise maximum over the training set before forming W (not in the
    paper's equations); not done here.

    Hyperparameters: ``q`` (0.7), ``ema`` a (0.7), ``init_seed`` (7777)."""

    defaults: dict[str, Any] = {"q": 0.7, "ema": 0.7, "init_seed": 7777}
    grid: dict[str, list] = {}

    def prepare(self) -> None:
        data = self.ctx.data
        seeds = [self.ctx.schedule.seed + int(hp["init_seed"]) for hp in self.hparams]
        self.biased_heads = self.ctx.aux.new_heads(seeds, self.head_scales())  # scales as the main heads' (cosine)
        self.biased = self.biased_heads.params  # (the step's state: CUDA-graph capture finds its tensors here)
        self.ema_b = torch.zeros(self.h, len(data.y), dtype=data.dtype, device=data.device)
        self.ema_d = torch.zeros_like(self.ema_b)
        self.seen = torch.zeros(len(data.y), dtype=torch.bool, device=data.device)  # visited at least once

    @classmethod
    def check(cls, hp: dict[str, Any]) -> None:
        if not 0 < hp["q"] <= 1:
            raise UserError(f"q must be in (0, 1], got {hp['q']}")
        if not 0 <= hp["ema"] < 1:
            raise UserError(f"ema must be in [0, 1), got {hp['ema']}")

    def extra_parameters(self) -> list[torch.Tensor]:
        return self.biased_heads.trainable()

    def biased_logits(self, rep: torch.Tensor) -> torch.Tensor:
        """Logits [h, B, K] of the biased heads on the detached representation."""
        return self.biased_heads.logits(rep.detach())

    def aux_logits(self, batch: Batch) -> torch.Tensor:
        """The biased heads B, trained in the stack's pass with ψ = GCE (``aux_terms``)."""
        return self.biased_logits(batch.rep)

    def aux_terms(self) -> Terms:
        return Terms(gce=self.hp("q"))

    reweights = True

    @torch.no_grad()
    def sample_weights(self, c: torch.Tensor, batch: Batch, c_aux: torch.Tensor | None) -> torch.Tensor:
        """W(x) = ℓ̃_B / (ℓ̃_B + ℓ̃_D) from the EMAs, updated in place with this batch's CE of D (``c``) and of B
        (``c_aux``); index_select / index_copy_: row gathers, far cheaper than x[:, idx] on [h, N]."""
        idx = batch.idx  # positions in the training set: distinct within a batch
        a = self.hp("ema")[:, None] * self.seen.index_select(0, idx).to(c.dtype)  # [h, B]: 0 at a first visit
        lb = a * self.ema_b.index_select(1, idx) + (1 - a) * c_aux
        ld = a * self.ema_d.index_select(1, idx) + (1 - a) * c
        self.ema_b.index_copy_(1, idx, lb)
        self.ema_d.index_copy_(1, idx, ld)
        self.seen.index_fill_(0, idx, True)
        return lb / (lb + ld).clamp_min(1e-12)
