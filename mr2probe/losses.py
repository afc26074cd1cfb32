"""One loss pass for a whole probe stack: the softmax cross-entropy form that nearly every method is.

Each method *declares* its heads' terms (:class:`Terms`); the stack holds them in a few tables (:class:`LossTables`)
and evaluates every head's loss in one pass over the logits z [H, B, K]:

    u_hbk = a_h,y_b · z_hbk + o_hk − δ_h,y_b · [k = y_b]                 (scale a, offset o, true-class margin δ)
    c_hb  = lse_k u_hbk − Σ_k q_hbk u_hbk,   q_hb = (1 − ε_h) e_y_b + ε_h / K         (label smoothing ε)
    ℓ_h   = (1/B) Σ_b w_hb · ψ_h(c_hb)
    ψ_h   = focal_γ ∘ gce_q,   gce_q(c) = (1 − e^{−q c}) / q  (q = 0: c),   focal_γ(c) = (1 − e^{−c})^γ · c
    w_hb  = ω_h,y_b · r_hb      (class weights ω; r from the methods' per-step hooks: JTT, CDB, LfF, the DROs)

with the gradient in closed form, ∂ℓ_h/∂z_hbk = (1/B) · w_hb · ψ′_h(c_hb) · a_h,y_b · (softmax(u_hb)_k − q_hbk):
the forward reads the logits twice (the scaled logits u, their log-sum-exp), the backward writes the gradient once
from u. Per-step hooks see c (detached, before ψ) and return the r of their rows, so Group DRO and χ² DRO weigh this
batch's class losses and LfF compares its two heads' losses between the log-sum-exp and the gradient.

Rows in the second mode, ``sigmoid`` (EQL), take the one-vs-all sigmoid loss instead:
    ℓ_h = (1/B) Σ_b Σ_k n_hk(b) · BCE(z_hbk, [k = y_b]),   n_hk(b) = 1 − ν_hk · [k ≠ y_b],   ∂ = n (σ(z) − t) / B
with ν_hk the dropped negative terms (EQL's rare classes).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

# (rows, hook): the hook maps the c [H, B] of every row (detached) to the weights r [h, B] of the rows ``rows``
Hook = tuple[slice, Callable[[torch.Tensor], torch.Tensor]]


@dataclass
class Terms:
    """What a method declares for its h heads (None: the neutral value; tensors on the training device).

    ``scale`` a: [h] (per head) or [h, K] (per head and true class: MR2's 1/γ_y); ``offset`` o [h, K]; ``margin``
    δ [h, K] (taken at the true class); ``class_weight`` ω [h, K]; ``smoothing`` ε, ``focal`` γ, ``gce`` q: [h];
    ``sigmoid``: the heads take the sigmoid mode, ``negatives_dropped`` ν [h, K] (bool) its dropped negatives.
    The pass leaves out what no row of the stack declares (a stack of plain CE heads reads z as u, no copy)."""

    scale: torch.Tensor | None = None
    offset: torch.Tensor | None = None
    margin: torch.Tensor | None = None
    class_weight: torch.Tensor | None = None
    smoothing: torch.Tensor | None = None
    focal: torch.Tensor | None = None
    gce: torch.Tensor | None = None
    sigmoid: bool = False
    negatives_dropped: torch.Tensor | None = None


# rows of LossTables.at_label (taken at the true class) and of LossTables.per_head
SCALE, MARGIN, WEIGHT = 0, 1, 2
SMOOTH, FOCAL, GCE = 0, 1, 2
GCE_OFF = 1e-30  # the q of rows without GCE: −expm1(−q c)/q = c (to rounding), 1 − q c = 1, in float32 and 64


class LossTables:
    """The declared terms of every row of a stack: ``at_label`` [3, H, K] (a, δ, ω: read at the true class with one
    gather per step), ``offset`` [H, K], ``per_head`` [3, H] (ε, γ, q), ``dropped`` [H, K] (sigmoid rows' ν).
    Python flags say which terms any row uses, so a stack of plain CE heads computes plain CE. Rows are written in
    place (:meth:`write`): the tensors a step reads stay the same objects."""

    def __init__(self, heads: int, num_classes: int, device: torch.device | str, dtype: torch.dtype) -> None:
        self.num_classes = num_classes
        self.at_label = torch.ones(3, heads, num_classes, device=device, dtype=dtype)
        self.at_label[MARGIN].zero_()
        self.offset = torch.zeros(heads, num_classes, device=device, dtype=dtype)
        self.per_head = torch.zeros(3, heads, device=device, dtype=dtype)
        self.per_head[GCE] = GCE_OFF
        self.dropped = torch.zeros(heads, num_classes, device=device, dtype=torch.bool)
        self.uses: set[str] = set()  # "scale", "offset", "margin", "smoothing", "focal", "gce"
        self.sigmoid: list[slice] = []  # row ranges in the sigmoid mode
        self.smoothed: list[slice] = []  # row ranges with label smoothing (their mean over classes is read)

    @property
    def heads(self) -> int:
        return self.offset.shape[0]

    @torch.no_grad()
    def write(self, rows: slice, terms: Terms, live: torch.Tensor | None = None) -> None:
        """Set the rows ``rows`` from ``terms`` (``live``: which of the terms' h rows are in the stack, in order;
        None: all). Only the terms given are written."""
        def pick(t: torch.Tensor) -> torch.Tensor:
            return t if live is None else t.index_select(0, live.to(t.device))

        k = self.num_classes
        if terms.scale is not None:
            self.uses.add("scale")
            s = pick(terms.scale)
            self.at_label[SCALE, rows] = s if s.ndim == 2 else s[:, None].expand(-1, k)
        for name, index, t in (("margin", MARGIN, terms.margin), ("class_weight", WEIGHT, terms.class_weight)):
            if t is not None:
                self.at_label[index, rows] = pick(t)
                self.uses.add(name)
        if terms.offset is not None:
            self.offset[rows] = pick(terms.offset)
            self.uses.add("offset")
        for name, index, t in (("smoothing", SMOOTH, terms.smoothing), ("focal", FOCAL, terms.focal),
                               ("gce", GCE, terms.gce)):
            if t is not None:
                self.per_head[index, rows] = pick(t)
                self.uses.add(name)
        if terms.smoothing is not None and rows not in self.smoothed:
            self.smoothed.append(rows)
        self.per_head[GCE].clamp_min_(GCE_OFF)
        if terms.sigmoid:
            self.at_label[WEIGHT, rows] = 0.0  # the softmax form gives these rows neither loss nor gradient
            if terms.negatives_dropped is not None:
                self.dropped[rows] = pick(terms.negatives_dropped)
            if rows not in self.sigmoid:
                self.sigmoid.append(rows)


def _transform(c: torch.Tensor, gamma: torch.Tensor | None, q: torch.Tensor | None
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """ψ(c) and ψ′(c) for ψ = focal_γ ∘ gce_q (module docstring); None for ψ′ = 1 (no transform)."""
    psi, grad = c, None
    if q is not None:  # gce_q(c) = −expm1(−q c)/q, gce′ = e^{−q c} = 1 − q·gce_q(c); rows without GCE hold q = 1e-30
        q = q[:, None]  # (LossTables), where gce_q(c) = c (to rounding) and gce′ = 1: no branch per row
        psi = torch.expm1(-q * c).div_(-q)
        grad = 1 - q * psi
    if gamma is not None:  # focal_γ(x) = m^γ x, m = 1 − e^{−x}; focal′ = m^γ + γ m^{γ−1} (1 − m) x; γ = 0: x, 1
        g = gamma[:, None]
        m = torch.expm1(-psi).neg_().clamp_min_(1e-30)  # m^{γ−1} stays finite where x = 0 (then the term is 0)
        mg = m.pow(g)
        outer = mg + g * mg / m * (1 - m) * psi
        psi = mg * psi
        grad = outer if grad is None else outer * grad
    return psi, grad


@dataclass
class _Pass:
    """What the forward of the loss form leaves for the closed-form backward."""

    u: torch.Tensor  # [H, B, K] the scaled, offset, margin-shifted logits
    lse: torch.Tensor  # [H, B]
    coef: torch.Tensor  # [H, B] w ψ′ a / B
    eps: torch.Tensor | None  # [H, 1] label smoothing, or None


@torch.no_grad()
def _forward(z: torch.Tensor, y: torch.Tensor, tables: LossTables, hooks: Sequence[Hook]
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, _Pass]:
    """The forward of the loss form on detached logits: (ψ(c) [H, B], w [H, B], c [H, B], what the backward reads).
    The hooks run here, outside any autograd function (they update method state in place)."""
    b = z.shape[1]
    target = y.view(1, -1, 1).expand(z.shape[0], -1, 1)
    scale, margin, weight = tables.at_label.index_select(2, y).unbind(0)  # [H, B] each
    uses = tables.uses
    if uses & {"scale", "offset", "margin"}:
        u = _scaled(z, scale, tables.offset if "offset" in uses else None)
    else:  # every a = 1, o = δ = 0: u is z itself (no pass; nothing writes into u)
        u = z
    if "margin" in uses:
        u.scatter_add_(2, target, -margin[..., None])
    lse = torch.logsumexp(u, 2)
    u_y = u.gather(2, target).squeeze(2)
    eps = tables.per_head[SMOOTH][:, None] if tables.smoothed else None
    c = lse - u_y if eps is None else lse - (1 - eps) * u_y
    for rows in tables.smoothed:  # −ε·mean_k u on the smoothed rows only (a pass over their logits alone)
        c[rows] -= eps[rows] * u[rows].mean(2)
    psi, dpsi = _transform(c, tables.per_head[FOCAL] if "focal" in uses else None,
                           tables.per_head[GCE] if "gce" in uses else None)
    w = weight
    if hooks:
        w = w.clone()
        for rows, hook in hooks:
            w[rows].mul_(hook(c))
    coef = w / b if dpsi is None else (w / b) * dpsi  # ∂ℓ/∂u_hb,· = coef · (softmax − q), coef = w ψ′ a / B
    coef = coef * scale if "scale" in uses else coef
    return psi, w, c, _Pass(u, lse, coef, eps)


class _StackCE(torch.autograd.Function):
    """ℓ [H] = Σ_b w ψ(c) / B from the forward's ψ(c) and w (sigmoid rows: their own loss), with the closed-form
    gradient with respect to z from what the forward left (:class:`_Pass`)."""

    @staticmethod
    def forward(ctx, z: torch.Tensor, psi: torch.Tensor, w: torch.Tensor, y: torch.Tensor, saved: _Pass,
                sigmoid: list[slice], dropped: torch.Tensor, smoothed: list[slice]) -> torch.Tensor:
        b = z.shape[1]
        losses = (w * psi).sum(1) / b
        for rows in sigmoid:
            losses[rows] = _sigmoid_rows(z[rows], y, dropped[rows], b)[0]
        ctx.flipped = not saved.u.is_contiguous() and saved.u.transpose(0, 1).is_contiguous()  # a transposed view
        # (the shared product's [B, H, K] in memory): save the contiguous tensor, not a view of it
        ctx.save_for_backward(z, saved.u.transpose(0, 1) if ctx.flipped else saved.u, saved.lse, saved.coef, y,
                              saved.eps if saved.eps is not None else saved.lse.new_zeros(0), dropped)
        ctx.sigmoid, ctx.smoothed = sigmoid, smoothed
        return losses

    @staticmethod
    @once_differentiable
    def backward(ctx, g: torch.Tensor):
        z, u, lse, coef, y, eps, dropped = ctx.saved_tensors
        flip = ctx.flipped  # then u is [B, H, K] (the product's layout): work there, so the gradient keeps it

        def lay(t: torch.Tensor) -> torch.Tensor:  # an [H, B] tensor in u's layout (contiguous: the elementwise ops'
            return (t.T.contiguous() if flip else t)[..., None]  # outputs follow their operands' order), class axis

        c = coef * g[:, None]  # [H, B]
        grad = torch.softmax(u, 2).mul_(lay(c))  # c · softmax(u) (one fused kernel from the saved u)
        target = y.view(-1, 1, 1).expand(-1, z.shape[0], 1) if flip else y.view(1, -1, 1).expand(z.shape[0], -1, 1)
        grad.scatter_add_(2, target, -lay(c * (1 - eps) if eps.numel() else c))
        grad = grad.transpose(0, 1) if flip else grad
        for rows in ctx.smoothed:  # − c ε / K on the smoothed rows
            grad[rows] -= (c[rows] * eps[rows] / z.shape[2])[..., None]
        for rows in ctx.sigmoid:
            grad[rows] = _sigmoid_rows(z[rows], y, dropped[rows], z.shape[1])[1] * g[rows, None, None]
        return grad, None, None, None, None, None, None, None


def _scaled(z: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
    """u = a·z + o in z's memory layout: the shared product gives z as [B, H, K] in memory (a transposed view), and a
    u (and so a gradient) in that layout reaches the product's backward without a copy. One op."""
    if not z.is_contiguous() and z.transpose(0, 1).is_contiguous():
        zt, st = z.transpose(0, 1), scale.T.contiguous()[..., None]  # every operand in [B, H, K] order (an
        ut = zt * st if offset is None else torch.addcmul(offset[None], st, zt)  # elementwise op's output follows)
        return ut.transpose(0, 1)
    return z * scale[..., None] if offset is None else torch.addcmul(offset[:, None, :], scale[..., None], z)


def _sigmoid_rows(z: torch.Tensor, y: torch.Tensor, dropped: torch.Tensor, b: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sigmoid-mode rows: (ℓ [h], ∂ℓ/∂z [h, B, K]) of Σ_k n_k · BCE(z_k, t_k) averaged over the B samples."""
    t = (y[:, None] == torch.arange(z.shape[2], device=y.device)).to(z.dtype)  # [B, K] (no host read, unlike one_hot)
    keep = 1.0 - (dropped[:, None, :] & (t == 0)[None]).to(z.dtype)  # n [h, B, K]
    bce = F.softplus(z) - z * t
    return (keep * bce).sum((1, 2)) / b, keep * (torch.sigmoid(z) - t) / b


def stack_loss(z: torch.Tensor, y: torch.Tensor, tables: LossTables, hooks: Sequence[Hook] = ()) -> torch.Tensor:
    """Per-row losses ℓ [H] of logits z [H, B, K] and labels y [B] under ``tables`` (module docstring); the
    gradient with respect to z is the closed form. ``hooks``: the per-step weights of some rows."""
    return stack_loss_and_ce(z, y, tables, hooks)[0]


def stack_loss_and_ce(z: torch.Tensor, y: torch.Tensor, tables: LossTables, hooks: Sequence[Hook] = ()
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`stack_loss` and the per-sample c [H, B] (detached; what the hooks see), for a later pass's hooks."""
    psi, w, c, saved = _forward(z.detach(), y, tables, list(hooks))
    return _StackCE.apply(z, psi, w, y, saved, list(tables.sigmoid), tables.dropped, list(tables.smoothed)), c


def label_counts(y: torch.Tensor, num_classes: int, dtype: torch.dtype) -> torch.Tensor:
    """n_k, the count of each class among the labels y [B] → [K], by ``index_add`` into K zeros: static shapes and
    no host read (``one_hot`` reads the labels' range on the host; ``bincount``'s size depends on the data)."""
    return torch.zeros(num_classes, dtype=dtype, device=y.device).index_add_(0, y, torch.ones_like(y, dtype=dtype))


def class_means(values: torch.Tensor, y: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` [h, B] over the batch samples of each class → [h, K], with ``counts`` [K] the batch counts
    (:func:`label_counts`); a class absent from the batch (count 0) has mean 0."""
    sums = values.new_zeros(values.shape[0], counts.shape[0]).index_add_(1, y, values)
    return sums / counts.clamp_min(1)


def class_mean_weights(q: torch.Tensor, y: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Per-sample weights r [h, B] with (1/B) Σ_b r_hb c_hb = Σ_k q_hk · (mean of c over the batch samples of class
    k): r_hb = B · q_h,y_b / n_y_b, n = ``counts`` [K] the batch counts (:func:`label_counts`; a class-weighted sum of
    class means as a batch mean)."""
    return (q / counts.clamp_min(1)).index_select(1, y) * y.shape[0]
