"""MR2: margin regularization for class-wise performance disparity (Zhu et al., ICLR 2026; spec: mr2.md).

    γ_k = c̄ · K · v_k^e / Σ_j v_j^e          (v_k: class variability of the representation, e = 1/3)
    ℓ_γ,ce(x, y) = CE(f(x) / γ_y, y)         (all logits divided by the margin of the TRUE class)
    a(x) = log(1 + Σ_{x⁺≠x, y⁺=y} exp((‖z − z⁺‖² − 2 s̄) / τ)),   s̄ = mean_k ŝ²_k (L2)
    ℓ_s̄ = (1/A) Σ_x τ·a(x)                                  rep_scale="mr2probe" (default; A anchors)
    ℓ_s̄ = τ/(100·K) · Σ_{c: n_c ≥ 2} (1/n_c) Σ_{x: y=c} a(x)  rep_scale="reference" (at τ = 10·D this is
                                        D/10/K · Σ_c mean_c a, the authors' public code's normalisation)
    ℓ = ℓ_γ,ce + λ · ℓ_s̄                       (ℓ_s̄ only with a trainable adapter)

(D = d, the width of z.) With n_c the batch count of class c and C the classes with n_c ≥ 2, the two scales
differ by exactly 100·K/C when every such class has the same n_c (about that otherwise): with every class in the
batch (C = K), λ = 0.1 here is λ = 10 in the reference form, and the reference's λ = 0.1 is λ = 0.001 here.
Not reproduced from the authors' code: its s̄ is the mean of the Lp (p = 5) ŝ²_k, here the L2 one (spec).

Statistics (μ̂_k, ŝ²_k, v_k, s̄) and the distances of ℓ_s̄ are measured on ``stats_on``: ``input`` (default
[choice]: g(x) before the head's normalisation — the raw features without adapter — as the authors' code does)
or ``classifier`` (what the classifier sees, z/‖z‖ for a cosine head; the spec's first form). Identical for a
linear head. For a cosine head the default follows the class spread: on the positive control's Gaussian clusters
(σ_k = 1…3, 20 shots, 10 seeds; results/positive-control/synthetic-k10-d64-spread1-3-sep5-shots20-cosine*) the
margins' spread γ_max/γ_min is 1.925 on the input against 1.009 on z/‖z‖ (MR2 all but switched off), the premise
r_s(v_k, CE val accuracy) −0.84 against −0.41. With a trainable adapter ``input`` costs a second adapter pass per
step.
Statistics: exact, once, for frozen features (no adapter); exact at the start of every epoch with an adapter
([choice]; ``stats="ema"`` updates them per step with decay ``ema_decay`` instead, as the authors' code).
Defaults [choice]: p = 3, c̄ = 1, λ = 0.1, τ = 10·d (``tau=0`` means "10·d"), e = 1/3.
"""
from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from ..errors import UserError
from ..heads import HEADS
from ..losses import Terms, label_counts
from ..stats import ClassStats, batch_class_stats, class_stats_chunked, margins
from ._base import METHODS, Batch, ClassStatsKey, Method, per_head_ce


SYNC_FREE = False  # True: ``auto`` takes the dense layout on a CPU too (benchmarks/step_ops.py counts the device path)


def logit_margin_ce(logits: torch.Tensor, y: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """CE(f(x)/γ_y, y) per head and sample: logits [h, B, K], y [B], γ [h, K] → [h, B]."""
    return per_head_ce(logits / gamma[:, y].unsqueeze(-1), y)


def rep_margin_loss(z: torch.Tensor, y: torch.Tensor, s_bar: torch.Tensor, tau: torch.Tensor,
                    layout: str = "auto", reference: bool | torch.Tensor = False,
                    num_classes: int | None = None) -> torch.Tensor:
    """Per head, over the A anchors x (samples with a same-class partner),
    a(x) = log(1 + Σ₊ exp((‖z − z⁺‖² − 2s̄)/τ));  ``reference`` False: (1/A) Σ_x τ·a(x);
    True: τ/(100·K) · Σ_c (1/n_c) Σ_{x∈c} a(x), with K = ``num_classes`` and n_c the batch count of class c.

    z [h, B, d]; s̄, τ [h]; ``reference`` a bool or per head [h]. The reference form is the public code's
    D/10/K · Σ_c mean_c log(1 + Σ exp((d² − 2s̄)/(10·D))) at τ = 10·D. Only same-class pairs matter, in one of
    three layouts (same value; ``layout`` forces one): ``dense`` one masked B×B matrix (static shapes, no host sync:
    what ``auto`` takes on a GPU, under torch.compile and with ``SYNC_FREE``); ``blocks`` sorts the batch by class
    into padded blocks [h, C, m, d] (C classes present, m = largest class count) whose m×m Gram matrices come from
    one batched product (C·m²·d work instead of B²·d); ``pairs`` lists the P same-class pairs and gathers them (P·d
    work). ``auto`` takes pairs when P < C·m, i.e. when most block rows would be padding (many classes, few samples
    each: K = 1000, B = 512).
    log(1 + Σ exp a) = softplus(logsumexp a)."""
    if layout not in ("auto", "pairs", "blocks", "dense"):
        raise ValueError(f"layout must be auto, pairs, blocks or dense, got {layout!r}")
    if layout == "dense" or (layout == "auto" and (z.is_cuda or SYNC_FREE or torch.compiler.is_compiling())):
        return _dense_rep_margin(z, y, s_bar, tau, reference, num_classes)
    order = torch.argsort(y, stable=True)
    _, counts = torch.unique_consecutive(y[order], return_counts=True)
    n_pairs = int((counts * (counts - 1)).sum())
    if n_pairs == 0:
        return z.new_zeros(z.shape[0])
    if layout == "auto":
        layout = "pairs" if n_pairs < len(counts) * int(counts.max()) else "blocks"
    shift = (2 * s_bar / tau)[:, None]
    if layout == "pairs":
        lse, n_c = _pair_logsumexp(z, y, tau)
    else:
        lse, n_c = _block_logsumexp(z, order, counts, tau)
    a = torch.nn.functional.softplus(lse - shift)  # [h, A]
    ours = tau * a.mean(1)
    if isinstance(reference, bool) and not reference:  # a Python bool: no device sync in the training step
        return ours
    ref = torch.as_tensor(reference, dtype=torch.bool, device=z.device).expand(z.shape[0])
    if num_classes is None:
        raise ValueError("rep_margin_loss: the reference scale needs num_classes")
    # each class present contributes the mean over its n_c anchors: weight 1/n_c per anchor
    theirs = tau / (100.0 * num_classes) * (a / n_c.to(a.dtype)).sum(1)
    return torch.where(ref, theirs, ours)


def _dense_rep_margin(z: torch.Tensor, y: torch.Tensor, s_bar: torch.Tensor, tau: torch.Tensor,
                      reference: bool | torch.Tensor, num_classes: int | None) -> torch.Tensor:
    """The same loss from one B×B distance matrix per head, masked to same-class off-diagonal pairs (the spec's form):
    B²·d work, static shapes and no host sync (what a GPU step, a CUDA graph or torch.compile needs). A row without
    partner takes its own diagonal as a stand-in (a finite log-sum-exp) and is masked out of the mean."""
    b = z.shape[1]
    eye = torch.eye(b, dtype=torch.bool, device=z.device)
    same = (y[:, None] == y[None, :]) & ~eye
    anchor = same.any(1)  # [B]
    sq = z.pow(2).sum(-1)
    dist = (sq[:, :, None] + sq[:, None, :] - 2 * torch.bmm(z, z.transpose(1, 2))).clamp_min(0) / tau[:, None, None]
    lse = torch.logsumexp(dist.masked_fill(~(same | (eye & ~anchor[:, None])), float("-inf")), -1)  # [h, B]
    a = torch.nn.functional.softplus(lse - (2 * s_bar / tau)[:, None]) * anchor
    ours = tau * a.sum(1) / anchor.sum().clamp_min(1)
    if isinstance(reference, bool) and not reference:
        return ours
    if num_classes is None:
        raise ValueError("rep_margin_loss: the reference scale needs num_classes")
    n_c = label_counts(y, num_classes, a.dtype).index_select(0, y)  # the batch count of each anchor's class
    theirs = tau / (100.0 * num_classes) * (a / n_c).sum(1)
    ref = torch.as_tensor(reference, dtype=torch.bool, device=z.device).expand(z.shape[0])
    return torch.where(ref, theirs, ours)


def _pair_logsumexp(z: torch.Tensor, y: torch.Tensor, tau: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logsumexp over partners of ‖z_i − z_j‖²/τ for every anchor i [h, A], from the list of same-class pairs,
    and the batch count n_{y_i} of each anchor's class [A]."""
    h, b, _ = z.shape
    same = (y[:, None] == y[None, :]) & ~torch.eye(b, dtype=torch.bool, device=y.device)
    i, j = same.nonzero(as_tuple=True)
    sq = z.pow(2).sum(-1)
    zi, zj = z.index_select(1, i), z.index_select(1, j)  # row gathers (z[:, i] is several times slower on a CPU)
    dist = (sq.index_select(1, i) + sq.index_select(1, j) - 2 * (zi * zj).sum(-1)).clamp_min(0) / tau[:, None]
    top = torch.full((h, b), float("-inf"), dtype=z.dtype, device=z.device)
    top = top.scatter_reduce(1, i.expand(h, -1), dist.detach(), "amax")  # per-anchor max, for stability
    total = z.new_zeros(h, b).index_add(1, i, torch.exp(dist - top[:, i]))
    anchors = torch.unique(i)
    return top[:, anchors] + torch.log(total[:, anchors]), torch.bincount(y)[y[anchors]]


def _block_logsumexp(z: torch.Tensor, order: torch.Tensor, counts: torch.Tensor, tau: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The same, from class blocks [h, C, m, d] (the sorted batch gathered into one padded row block per class;
    padding and the diagonal are masked out of each block's m×m distances)."""
    b, dev = z.shape[1], z.device
    c, m = len(counts), int(counts.max())
    start = torch.cumsum(counts, 0) - counts  # first sorted row of each class
    ar = torch.arange(m, device=dev)
    # slot (c, r) of the flattened blocks [C·m] reads sorted row start_c + r; padding slots (r ≥ n_c) read any row
    # (clamped into the batch): they are masked out of the forward and get zero weight in the backward
    slot = order[(start[:, None] + ar).clamp_max(b - 1).flatten()]
    valid = ar < counts[:, None]  # [C, m]
    pair = valid[:, :, None] & valid[:, None, :] & (ar[:, None] != ar[None, :])
    # where each batch row sits in the flattened blocks: the backward gathers its rows from there
    block = torch.repeat_interleave(torch.arange(c, device=dev), counts, output_size=b)  # class of each sorted row
    where = torch.empty(b, dtype=torch.long, device=dev)
    where[order] = block * m + torch.arange(b, device=dev) - start[block]  # block·m + rank in the block
    lse = _BlockLSE.apply(z, slot, where, pair, tau)  # [h, C, m]
    anchor = pair.any(-1)  # [C, m]
    return lse[:, anchor], counts[:, None].expand(c, m)[anchor]


class _BlockLSE(torch.autograd.Function):
    """lse_i = logsumexp over partners j of d_ij = ‖z_i − z_j‖²/τ in each class block, with its gradient in closed
    form: for upstream g, W_ij = g_i · softmax_j(d_i·) (0 where masked, or where the rounded ‖·‖² fell below 0 and
    was clamped), ∂/∂z_k Σ_i g_i lse_i = (2/τ)·[(Σ_j (W + Wᵀ)_kj) z_k − ((W + Wᵀ) z)_k]. One batched Gram product
    forward and one backward (autograd of the same forward takes three, and scatters the padded blocks back)."""

    @staticmethod
    def forward(ctx, z: torch.Tensor, slot: torch.Tensor, where: torch.Tensor, pair: torch.Tensor,
                tau: torch.Tensor) -> torch.Tensor:
        h, d = z.shape[0], z.shape[2]
        c, m = pair.shape[:2]
        # index_select, not z[:, slot]: a row copy per slot (advanced indexing is several times slower on a CPU)
        blocks = z.index_select(1, slot).view(h, c, m, d)
        sq = z.pow(2).sum(-1).index_select(1, slot).view(h, c, m)  # from the unpadded rows
        raw = sq[..., :, None] + sq[..., None, :] - 2 * torch.matmul(blocks, blocks.transpose(-1, -2))
        keep = pair & (raw >= 0)  # clamp_min(0) passes no gradient below 0
        dist = (raw.clamp_min(0) / tau[:, None, None, None]).masked_fill(~pair, float("-inf"))
        lse = torch.logsumexp(dist, dim=-1)  # -inf for a row without partner (padding, a class of one)
        ctx.save_for_backward(z, blocks, dist, lse, keep, tau, where)
        return lse

    @staticmethod
    @once_differentiable  # the saved tensors are constants here: a second derivative would be wrong, so refuse
    def backward(ctx, g: torch.Tensor):
        z, blocks, dist, lse, keep, tau, where = ctx.saved_tensors
        has = torch.isfinite(lse)
        soft = torch.exp(dist - lse.masked_fill(~has, 0)[..., None])  # softmax over partners, 0 where masked
        w = ((g.masked_fill(~has, 0) / tau[:, None, None])[..., None] * soft).masked_fill(~keep, 0)
        w = w + w.transpose(-1, -2)
        h, c, m, d = blocks.shape
        mixed = torch.matmul(w, blocks).reshape(h, c * m, d).index_select(1, where)  # ((W + Wᵀ) z)_k per row [h, B, d]
        return 2 * (w.sum(-1).reshape(h, c * m).index_select(1, where)[..., None] * z - mixed), None, None, None, None


@METHODS.register("mr2", help="MR2: logit margins from class variability + representation margin (ICLR 2026); "
                   "rep_scale=mr2probe|reference, stats_on=classifier|input")
class MR2(Method):
    """ℓ = CE(f(x)/γ_y, y) + λ·ℓ_s̄ with γ from the class variability of the representation (module docstring).

    Hyperparameters: ``p`` statistics norm (3), ``c_bar`` mean margin (1; grid {1, 2}), ``lam`` λ (0.1; with a
    trainable adapter also searched over ``adapter_grid`` {0.01, 0.1, 1, 10}, which holds both forms' defaults
    and their equivalents: mr2probe's 0.1 is about the reference's 10), ``tau`` τ (0 = 10·d), ``exponent`` e
    (1/3), ``uniform`` γ_k = c̄ (False), ``stats`` exact|ema, ``ema_decay`` (0.999), ``rep_scale``
    mr2probe|reference (normalisation of ℓ_s̄, default mr2probe), ``stats_on`` classifier|input (where the
    statistics and the distances of ℓ_s̄ are measured, default input: the authors' code's unnormalised g(x), which
    follows the class spread under a cosine head; ``classifier``: what the classifier sees). ``rep_scale`` and
    ``stats_on`` may differ between heads of a slice; ``stats`` may not."""

    defaults: dict[str, Any] = {"p": 3.0, "c_bar": 1.0, "lam": 0.1, "tau": 0.0, "exponent": 1 / 3,
                                "uniform": False, "stats": "exact", "ema_decay": 0.999,
                                "rep_scale": "mr2probe", "stats_on": "input"}
    grid = {"c_bar": [1.0, 2.0]}
    # λ points searched only when the adapter is trainable (the trainer adds ``adapter_grid`` to ``grid`` then;
    # without an adapter ℓ_s̄ is constant and λ has no effect): one decade apart, spanning both scales of ℓ_s̄
    # (≈ 100·K/C apart): each form's default 0.1, and mr2probe's 0.1 in the reference form (10).
    adapter_grid: dict[str, list] = {"lam": [0.01, 0.1, 1.0, 10.0]}

    @classmethod
    def check(cls, hp: dict[str, Any]) -> None:
        rules = {"c_bar": (hp["c_bar"] > 0, "> 0"), "p": (hp["p"] >= 1, "≥ 1"), "lam": (hp["lam"] >= 0, "≥ 0"),
                 "tau": (hp["tau"] >= 0, "≥ 0 (0 = 10·d)"), "exponent": (hp["exponent"] > 0, "> 0"),
                 "ema_decay": (0 <= hp["ema_decay"] < 1, "in [0, 1)")}
        for key, (ok, need) in rules.items():
            if not ok:
                raise UserError(f"{key} must be {need}, got {hp[key]}")
        choices = {"stats": ("exact", "ema"), "rep_scale": ("mr2probe", "reference"),
                   "stats_on": ("classifier", "input")}
        for key, allowed in choices.items():
            if hp[key] not in allowed:
                raise UserError(f"{key} must be {' or '.join(allowed)}, got {hp[key]!r}")

    def prepare(self) -> None:
        self.uses_rep = self.ctx.heads.config.adapter != "none" and any(hp["lam"] > 0 for hp in self.hparams)
        if self.ctx.heads.config.adapter == "none":
            self.ctx.log(f"{self.name}: frozen features and no adapter: statistics computed once; "
                         "the representation margin term is constant and skipped")
        # stats_on=input differs from what the classifier sees only for heads that transform z (cosine: z/‖z‖)
        own = HEADS.get(self.ctx.heads.config.head).has_own_transform
        self.space = [hp["stats_on"] if own else "classifier" for hp in self.hparams]
        dev = self.ctx.data.device
        self.on_input = torch.tensor([sp == "input" for sp in self.space], dtype=torch.bool, device=dev)
        self.any_input, self.all_input = "input" in self.space, all(sp == "input" for sp in self.space)
        self.reference = torch.tensor([hp["rep_scale"] == "reference" for hp in self.hparams], dtype=torch.bool,
                                      device=dev)
        self.any_reference = any(hp["rep_scale"] == "reference" for hp in self.hparams)
        if "input" in self.space and (self.ctx.heads.represent_input_train is None
                                      or self.ctx.heads.represent_input is None):
            raise ValueError(f"{self.name}: stats_on=input needs a FitContext with represent_input(_train)")
        k, dev, dtype = self.ctx.data.num_classes, self.ctx.data.device, self.ctx.data.dtype
        # state updated in place (the step reads the same tensors throughout: CUDA-graph capture needs that)
        self.v = torch.zeros(self.h, k, dtype=dtype, device=dev)
        self.s2_l2 = torch.zeros(self.h, k, dtype=dtype, device=dev)  # ŝ²_k (L2), whose class mean is s̄
        self.s_bar = torch.zeros(self.h, dtype=dtype, device=dev)
        self.gamma = torch.ones(self.h, k, dtype=dtype, device=dev)
        self.inv_gamma = torch.ones_like(self.gamma)
        self.uniform = torch.tensor([bool(hp["uniform"]) for hp in self.hparams], device=dev)
        self.seen = torch.zeros(k, dtype=torch.bool, device=dev)  # EMA: classes that had a batch
        self.p_rows = [(p, torch.tensor([i for i, hp in enumerate(self.hparams) if float(hp["p"]) == p], device=dev))
                       for p in sorted({float(hp["p"]) for hp in self.hparams})]  # distinct p: no sync per step
        self.ema = self.hparams[0]["stats"] == "ema" and self.ctx.heads.config.adapter != "none"
        self.per_step_terms = self.ema
        if self.ctx.heads.config.adapter == "none" or self.hparams[0]["stats"] != "exact":
            self._update_stats()
        d = self.ctx.heads.rep_dim
        self.tau = torch.where(self.hp("tau") > 0, self.hp("tau"), torch.full_like(self.hp("tau"), 10.0 * d))

    def on_epoch_start(self, epoch: int) -> None:
        if self.ctx.heads.config.adapter != "none" and self.hparams[0]["stats"] == "exact":
            self._update_stats()

    def _update_stats(self) -> None:
        """Exact statistics of the current representation, one no-grad pass per distinct (stats_on, p)."""
        ps = self.hp("p")
        k = self.ctx.data.num_classes
        v = torch.empty(self.h, k, dtype=self.ctx.data.dtype, device=self.ctx.data.device)
        s2 = torch.empty_like(v)
        for space in sorted(set(self.space)):
            in_space = self.on_input == (space == "input")
            chunks = self.ctx.heads.represent_input_train if space == "input" else self.ctx.heads.represent_train
            for p in torch.unique(ps[in_space]).tolist():
                measure = partial(class_stats_chunked, chunks, k, p)  # one no-grad pass over the training set
                if self.ctx.heads.config.adapter == "none":  # frozen representation: the same for every MR2-family
                    # slice and every stack on these features (``ctx.shared`` lives with them) with this head kind
                    key = ClassStatsKey(head=self.ctx.heads.config.head, stats_on=space, p=p)
                    st: ClassStats = self.ctx.shared.get_or_compute(key, measure)
                else:
                    st = measure()
                rows = in_space & (ps == p)
                v[rows] = st.v.expand(self.h, -1)[rows]
                s2[rows] = st.s2_l2.expand(self.h, -1)[rows]
        self.v.copy_(v)
        self.s2_l2.copy_(s2)
        self.s_bar.copy_(s2.mean(1))
        self._set_margins()

    @torch.no_grad()
    def _set_margins(self) -> None:
        """γ from the current v (γ_k = c̄ for heads with ``uniform``), and 1/γ, the loss form's scale, in place."""
        gamma = margins(self.v, self.hp("c_bar"), self.hp("exponent"))
        self.gamma.copy_(torch.where(self.uniform[:, None], self.hp("c_bar")[:, None].expand_as(gamma), gamma))
        torch.reciprocal(self.gamma, out=self.inv_gamma)

    @torch.no_grad()
    def _ema(self, z: torch.Tensor, y: torch.Tensor) -> None:
        """Per-step EMA of v_k and ŝ²_k (option ``stats="ema"``) for every class present in the batch, as the
        authors' code: a class's first batch sets its statistics (until then they are the exact ones of the
        initial representation), later batches move them by v_k ← d·v_k + (1 − d)·v̂_k (d = ``ema_decay``); classes
        absent from the batch keep theirs. Masks and counts by ``index_add``: no host sync."""
        k = self.ctx.data.num_classes
        present = label_counts(y, k, z.dtype) > 0  # [K]
        decay = self.hp("ema_decay")[:, None]
        keep = torch.where(self.seen, decay, torch.zeros_like(decay))  # [h, K]: 0 at a class's first batch
        for p, rows in self.p_rows:
            st = batch_class_stats(z.detach(), y, k, p)
            zr = st.v.expand(self.h, -1).index_select(0, rows)
            sr = st.s2_l2.expand(self.h, -1).index_select(0, rows)
            kr, on = keep.index_select(0, rows), present[None, :]
            self.v.index_copy_(0, rows, torch.where(on, kr * self.v.index_select(0, rows) + (1 - kr) * zr,
                                                    self.v.index_select(0, rows)))
            self.s2_l2.index_copy_(0, rows, torch.where(on, kr * self.s2_l2.index_select(0, rows) + (1 - kr) * sr,
                                                        self.s2_l2.index_select(0, rows)))
        self.seen |= present
        torch.mean(self.s2_l2, 1, out=self.s_bar)
        self._set_margins()

    def _measured(self, batch: Batch) -> torch.Tensor:
        """The batch representation in each head's ``stats_on`` space, [h|1, B, d]: ``batch.rep`` for
        ``classifier``; g(x) recomputed with grad (``ctx.heads.represent_input``) for ``input``."""
        if not self.any_input:  # Python bools from prepare(): no device sync per step
            return batch.rep
        u = self.ctx.heads.represent_input(batch.idx)
        if self.all_input:
            return u
        return torch.where(self.on_input[:, None, None], u, batch.rep)

    def stateless(self) -> bool:
        """Frozen features: the statistics and margins come from ``prepare`` alone (with a trainable adapter they
        follow the representation, from epoch to epoch or step to step)."""
        return self.ctx.heads.config.adapter == "none"

    def terms(self) -> Terms:
        """CE(f(x)/γ_y, y): the loss form's scale a = 1/γ_y."""
        return Terms(scale=self.inv_gamma)

    def before_step(self, batch: Batch) -> None:
        if self.ema:
            self._ema(self._measured(batch), batch.y)

    def extra_loss(self, batch: Batch) -> torch.Tensor | None:
        """λ·ℓ_s̄ (with a trainable adapter and λ > 0 for some head), else None."""
        if not self.uses_rep:
            return None
        z = self._measured(batch)
        return self.hp("lam") * rep_margin_loss(z.expand(self.h, -1, -1), batch.y, self.s_bar, self.tau,
                                                reference=self.reference if self.any_reference else False,
                                                num_classes=self.ctx.data.num_classes)

    def info(self) -> list[dict[str, Any]]:
        return [{"margins": self.gamma[i].tolist(), "variability": self.v[i].tolist(),
                 "s_bar": float(self.s_bar[i])} for i in range(self.h)]
