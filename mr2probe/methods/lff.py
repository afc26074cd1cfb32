"""Learning from Failure (Nam et al., NeurIPS 2020), as a pair of probe heads."""
from __future__ import annotations

from typing import Any

import torch

from ..heads import HEADS
from ._base import METHODS, Batch, Method, per_head_ce


def generalized_ce(ce: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """GCE (Zhang & Sabuncu, 2018) (1 − p_y^q) / q from the per-sample CE = −log p_y: ce [h, B], q [h] → [h, B]."""
    return -torch.expm1(-q[:, None] * ce) / q[:, None]  # p_y^q = exp(−q·CE)


@METHODS.register("lff", help="learning from failure: a GCE-trained biased head reweights the main head's CE "
                  "(Nam et al., NeurIPS 2020)")
class LfF(Method):
    """Two heads per run: the main (debiased) head D of the probe and a biased head B owned by this method.

    B has the same architecture as the probe's head (linear or cosine), reads the representation detached
    (it never trains the adapter), is initialised from the run seed offset by ``init_seed`` (default 7777,
    so it starts away from the main head and differs between seeds) and is trained with generalized CE:
        ℓ_B = (1 − p_B,y^q) / q,  q = 0.7.
    D is trained with relative-difficulty weights, per sample and detached:
        W(x) = ℓ̃_B(x) / (ℓ̃_B(x) + ℓ̃_D(x)),   ℓ_D = W(x) · CE(f_D(x), y),
    where ℓ̃ are per-sample exponential moving averages of the two CE losses over the sample's visits,
    ℓ̃ ← a·ℓ̃ + (1 − a)·CE with a = ``ema`` (default 0.7, the paper's choice; ``ema`` = 0 uses the current
    losses). The EMA starts at 0, so at a first visit W is exactly the ratio of the current losses. The
    class-wise max-normalisation of the EMA in the authors' code is not used [choice].
    loss = mean_B ℓ_D + mean_B ℓ_B (disjoint parameters: each head gets only its own gradient).

    Hyperparameters: ``q`` (0.7), ``ema`` a (0.7), ``init_seed`` (7777)."""

    defaults: dict[str, Any] = {"q": 0.7, "ema": 0.7, "init_seed": 7777}
    grid: dict[str, list] = {}

    def prepare(self) -> None:
        ctx = self.ctx
        self.head = HEADS.get(ctx.probe.head)()
        seeds = [ctx.seed + int(hp["init_seed"]) for hp in self.hparams]
        params = self.head.init(seeds, ctx.num_classes, ctx.rep_dim, ctx.probe)
        self.biased = {n: t.to(device=ctx.x.device, dtype=ctx.x.dtype).requires_grad_(not n.startswith("_"))
                       for n, t in params.items()}
        self.ema_b = torch.zeros(self.h, len(ctx.y), dtype=ctx.x.dtype, device=ctx.x.device)
        self.ema_d = torch.zeros_like(self.ema_b)

    def extra_parameters(self) -> list[torch.Tensor]:
        return [t for n, t in self.biased.items() if not n.startswith("_")]

    def biased_logits(self, rep: torch.Tensor) -> torch.Tensor:
        """Logits [h, B, K] of the biased heads on the detached representation."""
        return self.head.logits(rep.detach(), self.biased)

    def loss(self, batch: Batch) -> torch.Tensor:
        ce_b = per_head_ce(self.biased_logits(batch.rep), batch.y)
        ce_d = per_head_ce(batch.logits, batch.y)
        with torch.no_grad():
            a = self.hp("ema")[:, None]
            lb = a * self.ema_b[:, batch.idx] + (1 - a) * ce_b
            ld = a * self.ema_d[:, batch.idx] + (1 - a) * ce_d
            self.ema_b[:, batch.idx], self.ema_d[:, batch.idx] = lb, ld
            w = lb / (lb + ld).clamp_min(1e-12)
        return (w * ce_d).mean(1) + generalized_ce(ce_b, self.hp("q")).mean(1)
