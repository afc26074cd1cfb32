"""Plain per-method implementations of every method's loss formula (baselines.md, mr2.md), with autograd: the
references the stack's one-pass loss form (mr2probe.losses) is checked against. Each reads the method's prepared
constants (margins, class weights, …) and copies of its state; none changes the method."""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from mr2probe.methods import Method
from mr2probe.methods.fair_dro import chi2_simplex_weights
from mr2probe.methods.mr2 import rep_margin_loss


def ce(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """−log softmax(z)_y per head and sample: z [h, B, K] → [h, B]."""
    return -torch.log_softmax(z, -1).gather(-1, y.expand(z.shape[0], -1)[..., None])[..., 0]


def class_means(v: torch.Tensor, y: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    oh = F.one_hot(y, k).to(v.dtype)
    n = oh.sum(0)
    return v @ oh / n.clamp_min(1), n > 0


def _ce(m: Method, z, rep, y, idx) -> torch.Tensor:
    return ce(z, y).mean(1)


def _focal(m: Method, z, rep, y, idx) -> torch.Tensor:
    c = ce(z, y)
    return ((1 - torch.exp(-c)).clamp_min(0).pow(m.hp("gamma")[:, None]) * c).mean(1)


def _label_smoothing(m: Method, z, rep, y, idx) -> torch.Tensor:
    logp = torch.log_softmax(z, -1)
    eps = m.hp("eps")[:, None]
    return ((1 - eps) * ce(z, y) + eps * (-logp.mean(-1))).mean(1)


def _logit_adjust(m: Method, z, rep, y, idx) -> torch.Tensor:
    return ce(z + m.hp("tau")[:, None, None] * m.log_prior, y).mean(1)


def _balanced_softmax(m: Method, z, rep, y, idx) -> torch.Tensor:
    return ce(z + m.log_counts, y).mean(1)


def _class_balanced(m: Method, z, rep, y, idx) -> torch.Tensor:
    return (m.weights[:, y] * ce(z, y)).mean(1)


def _ldam(m: Method, z, rep, y, idx) -> torch.Tensor:
    onehot = F.one_hot(y, z.shape[2]).to(z.dtype)
    shifted = z * m.pre[:, None, None] - m.delta[:, y, None] * onehot
    return (m.weights[:, y] * ce(m.scale[:, None, None] * shifted, y)).mean(1)


def _eql(m: Method, z, rep, y, idx) -> torch.Tensor:
    t = F.one_hot(y, z.shape[2]).to(z.dtype).expand_as(z)
    bce = F.binary_cross_entropy_with_logits(z, t, reduction="none")
    return bce.masked_fill(m.rare[:, None, :] & (t == 0), 0.0).sum(-1).mean(1)


def _cdb(m: Method, z, rep, y, idx) -> torch.Tensor:
    return (m.weights[:, y] * m.keep[:, idx] * ce(z, y)).mean(1)


def _jtt(m: Method, z, rep, y, idx) -> torch.Tensor:
    return (m.weights[:, idx] * ce(z, y)).mean(1) / m.mean_weight


def _group_dro(m: Method, z, rep, y, idx) -> torch.Tensor:
    per_class, present = class_means(ce(z, y), y, z.shape[2])
    step = m.hp("eta")[:, None] * (per_class.detach() + m.adjust) * present
    q = torch.softmax(m.q.clone().log() + step, 1)
    return (q * per_class).sum(1)


def _fair_dro(m: Method, z, rep, y, idx) -> torch.Tensor:
    per_class, present = class_means(ce(z, y), y, z.shape[2])
    q = chi2_simplex_weights(per_class.detach(), present, m.hp("alpha"))
    return (q * per_class).sum(1)


def _lff(m: Method, z, rep, y, idx) -> torch.Tensor:
    zb = m.biased_logits(rep)
    ce_b, ce_d = ce(zb, y), ce(z, y)
    a = m.hp("ema")[:, None] * m.seen[idx].to(z.dtype)
    lb = a * m.ema_b[:, idx] + (1 - a) * ce_b.detach()
    ld = a * m.ema_d[:, idx] + (1 - a) * ce_d.detach()
    w = lb / (lb + ld).clamp_min(1e-12)
    q = m.hp("q")[:, None]
    return (w * ce_d).mean(1) + ((1 - torch.exp(-q * ce_b)) / q).mean(1)


def _supcon(m: Method, z, rep, y, idx) -> torch.Tensor:
    r = F.normalize(rep.expand(m.h, -1, -1), dim=-1)
    sim = r @ r.transpose(1, 2) / m.hp("temperature")[:, None, None]
    eye = torch.eye(len(y), dtype=torch.bool)
    log_prob = sim - torch.logsumexp(sim.masked_fill(eye, float("-inf")), -1, keepdim=True)
    pos = (y[:, None] == y[None, :]) & ~eye
    anchors = pos.sum(1) > 0
    mean_pos = log_prob.masked_fill(~pos, 0.0).sum(-1) / pos.sum(1).clamp_min(1)
    return -mean_pos[:, anchors].mean(1) + ce(z, y).mean(1)


def _mr2(m: Method, z, rep, y, idx) -> torch.Tensor:
    loss = ce(z / m.gamma[:, y].unsqueeze(-1), y).mean(1)
    if m.uses_rep:  # distances in stats_on's space: g(x) for "input" (the default), z/‖z‖ for "classifier"
        rep = m.ctx.heads.represent_input(idx) if m.space[0] == "input" else rep
        loss = loss + m.hp("lam") * rep_margin_loss(rep.expand(m.h, -1, -1), y, m.s_bar, m.tau, layout="pairs",
                                                    reference=m.reference, num_classes=z.shape[2])
    return loss


REFERENCES: dict[str, Callable[..., torch.Tensor]] = {
    "ce": _ce, "focal": _focal, "label_smoothing": _label_smoothing, "logit_adjust": _logit_adjust,
    "balanced_softmax": _balanced_softmax, "class_balanced": _class_balanced, "ldam": _ldam, "eql": _eql,
    "cdb": _cdb, "jtt": _jtt, "group_dro": _group_dro, "fair_dro": _fair_dro, "lff": _lff, "supcon": _supcon,
    "mr2": _mr2, "mr2_uniform": _mr2, "mr2_no_rep": _mr2, "mr2_sqrt": _mr2, "mr2_linear": _mr2,
}


def reference_loss(m: Method, z: torch.Tensor, rep: torch.Tensor, y: torch.Tensor, idx: torch.Tensor,
                   **_: Any) -> torch.Tensor:
    """Per-head loss [h] of method ``m`` by its plain formula."""
    return REFERENCES[m.name](m, z, rep, y, idx)
