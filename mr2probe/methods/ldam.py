"""LDAM-DRW: label-distribution-aware margin loss with deferred re-weighting (Cao et al., NeurIPS 2019)."""
from __future__ import annotations

import math
from typing import Any

import torch

from ..errors import UserError
from ..losses import Terms
from ._base import METHODS, Method
from .class_balanced import effective_number_weights


def ldam_margins(counts: torch.Tensor, max_m: torch.Tensor) -> torch.Tensor:
    """Δ_k = max_m · n_k^(−1/4) / max_j n_j^(−1/4): counts [K], max_m [h] → [h, K] (largest Δ = max_m)."""
    base = counts.clamp_min(1).pow(-0.25)
    return max_m[:, None] * (base / base.max())[None, :]


def drw_start_epoch(epochs: int, frac: float) -> int:
    """T₀ = ⌊frac · E⌋: the first re-weighted epoch (the paper: 160 of 200). Any frac < 1 leaves ≥ 1 such epoch."""
    return int(math.floor(frac * epochs + 1e-9))


@METHODS.register("ldam", help="LDAM-DRW: CE(s·(ẑ − Δ_y e_y)), Δ_k ∝ n_k^(−1/4), class-balanced weights from 80% of "
                  "the epochs on (Cao et al., NeurIPS 2019); cosine: s=30 or head; linear: raw z, s_linear=1")
class LDAM(Method):
    """ℓ = w_y · CE(s · (ẑ − Δ_y e_y), y),  Δ_k = max_m · n_k^(−1/4) / max_j n_j^(−1/4)   (batch mean over B).

    Deferred re-weighting (DRW, the paper's Algorithm 1 and its LDAM-DRW results): w_k = 1 for epochs
    t < T₀ = ⌊``drw_frac`` · E⌋ (E = ``ctx.schedule.epochs``, the trainer's effective number of epochs), then the
    class-balanced weights w_k = (1 − β)/(1 − β^{n_k}) normalised to Σ_k w_k = K (β = ``drw_beta``, 0.9999)
    from epoch T₀ on. The paper defers at epoch 160 of 200: ``drw_frac`` = 0.8. ``drw`` = false is plain LDAM
    (w = 1 throughout); ``drw_frac`` = 0 re-weights from the start, 1 never. The weighted batch is averaged over
    its size B as in the paper's Algorithm 1 (the authors' code divides by Σ_batch w_y instead). Deviation: the
    paper anneals its SGD step-size ×0.01 at the switch; here the trainer's AdamW cosine schedule runs on, so the
    re-weighted phase gets the schedule's last 20% (about 1.3% of its lr integral).

    The rare classes get the largest margin; on a balanced training set every Δ_k = max_m (a constant margin
    for the true class) and every w_k = 1.

    How it combines with the probe heads [choice]:
    - ``cosine`` head: its logits are s_head · cos θ_k with s_head the head's cosine scale (``--scale``, per
      head). LDAM uses the normalised logits ẑ = z / s_head = cos θ and its own scale ``s`` (default 30), i.e.
      s·(cos θ − Δ_y e_y): exactly the paper's normalised-classifier form. ``s`` = "head" takes s = s_head,
      so LDAM's scale is chosen on val from the head's scale grid like every other method's (a tuned LDAM;
      the paper fixes 30). With ``--learn-scale`` the head's learned factor s_learned / s_head multiplies
      cos θ inside the bracket (LDAM's effective scale is then learned, starting at ``s``).
    - ``linear`` head: unnormalised logits have no fixed scale, so ``s`` is not applied; ẑ = z and the scale is
      ``s_linear`` (default 1): CE(z − Δ_y e_y), a margin of max_m logit units for the rarest class: the loss as
      the paper writes it on raw logits (its experiments normalise features and weights and scale by s), so the
      margins are weak here and DRW does most of the work.

    Hyperparameters: ``max_m`` (0.5), ``s`` (30 or "head", cosine heads), ``s_linear`` (1, linear heads), ``drw``
    (true), ``drw_frac`` (0.8), ``drw_beta`` β (0.9999)."""

    defaults: dict[str, Any] = {"max_m": 0.5, "s": 30.0, "s_linear": 1.0, "drw": True, "drw_frac": 0.8,
                                "drw_beta": 0.9999}
    grid: dict[str, list] = {}
    words = {"s": ("head",)}

    @classmethod
    def check(cls, hp: dict[str, Any]) -> None:
        rules = {"max_m": (hp["max_m"] >= 0, "≥ 0"),
                 "s": (hp["s"] == "head" or hp["s"] > 0, '> 0 or "head"'),
                 "s_linear": (hp["s_linear"] > 0, "> 0"), "drw_frac": (0 <= hp["drw_frac"] <= 1, "in [0, 1]"),
                 "drw_beta": (0 <= hp["drw_beta"] < 1, "in [0, 1)")}
        for key, (ok, need) in rules.items():
            if not ok:
                raise UserError(f"{key} must be {need}, got {hp[key]}")

    def prepare(self) -> None:
        self.delta = ldam_margins(self.ctx.data.counts, self.hp("max_m"))  # [h, K]
        if self.ctx.heads.config.head == "cosine":  # ẑ = z / s_head, s_head the head's cosine scale (per head)
            s_head = self.head_scales()
            self.pre = 1.0 / torch.tensor(s_head, dtype=self.delta.dtype, device=self.delta.device)
            # s = "head": LDAM's scale is the head's own, chosen on val from the scale grid like every method's
            own = [sh if hp["s"] == "head" else float(hp["s"]) for sh, hp in zip(s_head, self.hparams)]
            self.scale = torch.tensor(own, dtype=self.delta.dtype, device=self.delta.device)
        else:
            self.pre, self.scale = torch.ones_like(self.hp("s_linear")), self.hp("s_linear")
        self.cb = effective_number_weights(self.ctx.data.counts, self.hp("drw_beta"))  # [h, K]
        self.drw_epoch = [drw_start_epoch(self.ctx.schedule.epochs, float(hp["drw_frac"])) if hp["drw"] else None
                          for hp in self.hparams]
        self.weights = torch.ones_like(self.cb)  # [h, K]: w_k, 1 until the deferral epoch

    def on_epoch_start(self, epoch: int) -> None:
        on = torch.tensor([t is not None and epoch >= t for t in self.drw_epoch], device=self.cb.device)
        self.weights.copy_(torch.where(on[:, None], self.cb, torch.ones_like(self.cb)))

    def stateless(self) -> bool:
        return True

    def terms(self) -> Terms:
        """s·(ẑ − Δ_y e_y) with ẑ = pre · z: scale a = s·pre, true-class margin s·Δ, class weights w (DRW)."""
        return Terms(scale=self.scale * self.pre, margin=self.scale[:, None] * self.delta, class_weight=self.weights)

    def info(self) -> list[dict[str, Any]]:
        return [{"ldam_margins": self.delta[i].tolist(), "ldam_drw_epoch": self.drw_epoch[i],
                 "class_weights": self.weights[i].tolist()} for i in range(self.h)]
