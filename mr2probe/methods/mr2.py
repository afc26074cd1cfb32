"""MR2: margin regularization for class-wise performance disparity (Zhu et al., ICLR 2026; spec: mr2.md).

    γ_k = c̄ · K · v_k^e / Σ_j v_j^e          (v_k: class variability of the representation, e = 1/3)
    ℓ_γ,ce(x, y) = CE(f(x) / γ_y, y)         (all logits divided by the margin of the TRUE class)
    ℓ_s̄(x) = τ · log(1 + Σ_{x⁺≠x, y⁺=y} exp((‖z − z⁺‖² − 2 s̄) / τ)),   s̄ = mean_k ŝ²_k (L2)
    ℓ = ℓ_γ,ce + λ · ℓ_s̄                       (ℓ_s̄ only with a trainable adapter)

Statistics: exact, once, for frozen features (no adapter); exact at the start of every epoch with an adapter
([choice]; ``stats="ema"`` updates them per step with decay ``ema_decay`` instead, as the reference code).
Defaults [choice]: p = 3, c̄ = 1, λ = 0.1, τ = 10·d (``tau=0`` means "10·d"), e = 1/3.
"""
from __future__ import annotations

from typing import Any

import torch

from ..errors import UserError
from ..stats import ClassStats, class_stats, class_stats_chunked, margins
from ._base import METHODS, Batch, Method, per_head_ce


def logit_margin_ce(logits: torch.Tensor, y: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """CE(f(x)/γ_y, y) per head and sample: logits [h, B, K], y [B], γ [h, K] → [h, B]."""
    return per_head_ce(logits / gamma[:, y].unsqueeze(-1), y)


def rep_margin_loss(z: torch.Tensor, y: torch.Tensor, s_bar: torch.Tensor, tau: torch.Tensor,
                    layout: str = "auto") -> torch.Tensor:
    """Mean over anchors with ≥ 1 same-class partner of τ·log(1 + Σ₊ exp((‖z − z⁺‖² − 2s̄)/τ)).

    z [h, B, d]; s̄, τ [h]. Only same-class pairs matter, in one of two layouts (same value; ``layout``
    forces one): ``blocks`` sorts the batch by class into padded blocks [h, C, m, d] (C classes present,
    m = largest class count) whose m×m Gram matrices come from one batched product (C·m²·d work instead of
    B²·d); ``pairs`` lists the P same-class pairs and gathers them (P·d work). ``auto`` takes pairs when
    P < C·m, i.e. when most block rows would be padding (many classes, few samples each: K = 1000, B = 512).
    log(1 + Σ exp a) = softplus(logsumexp a)."""
    order = torch.argsort(y, stable=True)
    _, counts = torch.unique_consecutive(y[order], return_counts=True)
    n_pairs = int((counts * (counts - 1)).sum())
    if n_pairs == 0:
        return z.new_zeros(z.shape[0])
    if layout == "auto":
        layout = "pairs" if n_pairs < len(counts) * int(counts.max()) else "blocks"
    elif layout not in ("pairs", "blocks"):
        raise ValueError(f"layout must be auto, pairs or blocks, got {layout!r}")
    shift = (2 * s_bar / tau)[:, None]
    if layout == "pairs":
        lse = _pair_logsumexp(z, y, tau)
    else:
        lse = _block_logsumexp(z, order, counts, tau)
    return (tau[:, None] * torch.nn.functional.softplus(lse - shift)).mean(1)


def _pair_logsumexp(z: torch.Tensor, y: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """logsumexp over partners of ‖z_i − z_j‖²/τ for every anchor i, from the list of same-class pairs."""
    h, b, _ = z.shape
    same = (y[:, None] == y[None, :]) & ~torch.eye(b, dtype=torch.bool, device=y.device)
    i, j = same.nonzero(as_tuple=True)
    sq = z.pow(2).sum(-1)
    dist = (sq[:, i] + sq[:, j] - 2 * (z[:, i] * z[:, j]).sum(-1)).clamp_min(0) / tau[:, None]  # [h, P]
    top = torch.full((h, b), float("-inf"), dtype=z.dtype, device=z.device)
    top = top.scatter_reduce(1, i.expand(h, -1), dist.detach(), "amax")  # per-anchor max, for stability
    total = z.new_zeros(h, b).index_add(1, i, torch.exp(dist - top[:, i]))
    anchors = torch.unique(i)
    return top[:, anchors] + torch.log(total[:, anchors])


def _block_logsumexp(z: torch.Tensor, order: torch.Tensor, counts: torch.Tensor, tau: torch.Tensor
                     ) -> torch.Tensor:
    """The same, from class blocks: padding and the diagonal are masked out of each block's m×m distances."""
    h, b, d = z.shape
    c, m = len(counts), int(counts.max())
    block = torch.repeat_interleave(torch.arange(c, device=z.device), counts)  # class block of each sorted row
    rank = torch.arange(b, device=z.device) - torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    blocks = z.new_zeros(h, c, m, d)
    blocks[:, block, rank] = z[:, order]
    sq = z.new_zeros(h, c, m)
    sq[:, block, rank] = z[:, order].pow(2).sum(-1)
    valid = torch.zeros(c, m, dtype=torch.bool, device=z.device)
    valid[block, rank] = True
    pair = valid[:, :, None] & valid[:, None, :] & ~torch.eye(m, dtype=torch.bool, device=z.device)
    gram = torch.matmul(blocks, blocks.transpose(-1, -2))  # [h, C, m, m]
    dist = (sq[..., :, None] + sq[..., None, :] - 2 * gram).clamp_min(0) / tau[:, None, None, None]
    lse = torch.logsumexp(dist.masked_fill(~pair, float("-inf")), dim=-1)  # [h, C, m]
    return lse[:, pair.any(-1)]


@METHODS.register("mr2", help="MR2: logit margins from class variability + representation margin (ICLR 2026)")
class MR2(Method):
    """ℓ = CE(f(x)/γ_y, y) + λ·ℓ_s̄ with γ from the class variability of the representation (module docstring).

    Hyperparameters: ``p`` statistics norm (3), ``c_bar`` mean margin (1; grid {1, 2}), ``lam`` λ (0.1),
    ``tau`` τ (0 = 10·d), ``exponent`` e (1/3), ``uniform`` γ_k = c̄ (False), ``stats`` exact|ema,
    ``ema_decay`` (0.999)."""

    defaults: dict[str, Any] = {"p": 3.0, "c_bar": 1.0, "lam": 0.1, "tau": 0.0, "exponent": 1 / 3,
                                "uniform": False, "stats": "exact", "ema_decay": 0.999}
    grid = {"c_bar": [1.0, 2.0]}

    @classmethod
    def check(cls, hp: dict[str, Any]) -> None:
        rules = {"c_bar": (hp["c_bar"] > 0, "> 0"), "p": (hp["p"] >= 1, "≥ 1"), "lam": (hp["lam"] >= 0, "≥ 0"),
                 "tau": (hp["tau"] >= 0, "≥ 0 (0 = 10·d)"), "exponent": (hp["exponent"] > 0, "> 0"),
                 "ema_decay": (0 <= hp["ema_decay"] < 1, "in [0, 1)")}
        for key, (ok, need) in rules.items():
            if not ok:
                raise UserError(f"{key} must be {need}, got {hp[key]}")
        if hp["stats"] not in ("exact", "ema"):
            raise UserError(f"stats must be exact or ema, got {hp['stats']!r}")

    def prepare(self) -> None:
        self.uses_rep = self.ctx.probe.adapter != "none" and any(hp["lam"] > 0 for hp in self.hparams)
        if self.ctx.probe.adapter == "none":
            self.ctx.log(f"{self.name}: frozen features and no adapter: statistics computed once; "
                         "the representation margin term is constant and skipped")
        if self.ctx.probe.adapter == "none" or self.hparams[0]["stats"] != "exact":
            self._update_stats()
        d = self.ctx.rep_dim
        self.tau = torch.where(self.hp("tau") > 0, self.hp("tau"), torch.full_like(self.hp("tau"), 10.0 * d))

    def on_epoch_start(self, epoch: int) -> None:
        if self.ctx.probe.adapter != "none" and self.hparams[0]["stats"] == "exact":
            self._update_stats()

    def _update_stats(self) -> None:
        """Exact statistics of the current representation, one no-grad pass per distinct p."""
        ps = self.hp("p")
        v = torch.empty(self.h, self.ctx.num_classes, dtype=self.ctx.x.dtype, device=self.ctx.x.device)
        s_bar = torch.empty(self.h, dtype=v.dtype, device=v.device)
        for p in torch.unique(ps).tolist():
            if self.ctx.probe.adapter == "none":  # frozen representation: the same for every slice of the stack
                key = ("mr2-stats", p)
                if key not in self.ctx.shared:
                    self.ctx.shared[key] = class_stats_chunked(self.ctx.represent_train, self.ctx.num_classes, p)
                st: ClassStats = self.ctx.shared[key]
            else:
                st = class_stats_chunked(self.ctx.represent_train, self.ctx.num_classes, p)
            rows = ps == p
            v[rows] = st.v.expand(self.h, -1)[rows]
            s_bar[rows] = st.s_bar.expand(self.h)[rows]
        self.v, self.s_bar = v, s_bar
        self._set_margins()

    def _set_margins(self) -> None:
        """γ from the current v (or γ_k = c̄ for heads with ``uniform``)."""
        uniform = torch.tensor([bool(hp["uniform"]) for hp in self.hparams], device=self.v.device)
        gamma = margins(self.v, self.hp("c_bar"), self.hp("exponent"))
        self.gamma = torch.where(uniform[:, None], self.hp("c_bar")[:, None].expand_as(gamma), gamma)

    @torch.no_grad()
    def _ema(self, batch: Batch) -> None:
        """Per-step EMA of v and s̄ from the batch (option ``stats="ema"``)."""
        # A batch missing a class has no statistics for it: skip the update.
        present = torch.bincount(batch.y, minlength=self.ctx.num_classes) > 0
        if not bool(present.all()):
            return
        decay = self.hp("ema_decay")
        for p in torch.unique(self.hp("p")).tolist():
            st = class_stats(batch.rep.detach(), batch.y, self.ctx.num_classes, p)
            rows = self.hp("p") == p
            self.v[rows] = decay[rows, None] * self.v[rows] + (1 - decay[rows, None]) * st.v.expand(self.h, -1)[rows]
            self.s_bar[rows] = decay[rows] * self.s_bar[rows] + (1 - decay[rows]) * st.s_bar.expand(self.h)[rows]
        self._set_margins()

    def loss(self, batch: Batch) -> torch.Tensor:
        if self.hparams[0]["stats"] == "ema" and self.ctx.probe.adapter != "none":
            self._ema(batch)
        loss = logit_margin_ce(batch.logits, batch.y, self.gamma).mean(1)
        if self.uses_rep:
            z = batch.rep.expand(self.h, -1, -1)
            loss = loss + self.hp("lam") * rep_margin_loss(z, batch.y, self.s_bar, self.tau)
        return loss

    def info(self) -> list[dict[str, Any]]:
        return [{"margins": self.gamma[i].tolist(), "variability": self.v[i].tolist(),
                 "s_bar": float(self.s_bar[i])} for i in range(self.h)]
