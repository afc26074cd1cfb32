"""Class statistics of representations and the MR2 logit margins (../shared/spec/mr2.md).

For class k over the training split, with the statistics norm p:
    μ_k  = mean of z over class k
    ŝ²_k = mean over class k of ‖z − μ_k‖_p²          (mean squared deviation)
    v_k  = ‖μ_k‖_p² + ŝ²_k                           (feature variability)
    γ_k  = c̄ · K · v_k^e / Σ_j v_j^e                 (e = 1/3 by default; mean γ = c̄)
All functions accept a leading head axis ``[H, N, d]`` so a stack of probes is handled at once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch


def lp_sq(x: torch.Tensor, p: float) -> torch.Tensor:
    """‖x‖_p² along the last axis: (Σ_i |x_i|^p)^(2/p) (torch's fused norm reduction: no |x|^p temporary)."""
    return torch.linalg.vector_norm(x, p, dim=-1).square()


@dataclass
class ClassStats:
    """Per-class statistics; tensors have shape [..., K] (``mean``: [..., K, d])."""

    mean: torch.Tensor  # μ_k
    s2: torch.Tensor  # ŝ²_k with the Lp norm
    v: torch.Tensor  # v_k = ‖μ_k‖_p² + ŝ²_k
    s2_l2: torch.Tensor  # ŝ²_k with the L2 norm (for s̄ of the representation margin loss)
    counts: torch.Tensor  # n_k

    @property
    def s_bar(self) -> torch.Tensor:
        """s̄ = (1/K) Σ_k ŝ²_k (L2): half the expected squared distance between two samples of one class."""
        return self.s2_l2.mean(-1)


# The deviation pass works in pieces of PIECE_ROWS rows, so its temporaries stay small (measured ~2× faster than one
# 8192-row piece on a CPU, where each fresh multi-MB temporary costs page faults), and finds μ_y by a one-hot product
# up to GATHER_ABOVE classes, by a gather beyond (where the product's b·K·d would cost more).
PIECE_ROWS = 2048
GATHER_ABOVE = 64


def _onehot(y: torch.Tensor, k: int, dtype: torch.dtype) -> torch.Tensor:
    return (y[:, None] == torch.arange(k, device=y.device)).to(dtype)  # one_hot reads y's range on the host


def class_stats(z: torch.Tensor, y: torch.Tensor, num_classes: int, p: float = 3.0) -> ClassStats:
    """Exact statistics of ``z`` ([N, d] or [H, N, d]) with labels ``y`` [N]."""
    return class_stats_chunked(lambda: iter([(z, y)]), num_classes, p)


def class_stats_chunked(chunks: Callable[[], Iterable[tuple[torch.Tensor, torch.Tensor]]], num_classes: int,
                        p: float = 3.0) -> ClassStats:
    """Exact statistics from a re-iterable stream of ``(z [.., b, d], y [b])`` chunks (two passes: means, then
    deviations), so the representations of a large training set never need to be held at once."""
    sums = counts = None
    for z, y in chunks():
        oh = _onehot(y, num_classes, z.dtype)  # [b, K]
        part = oh.T @ z if z.ndim == 2 else torch.einsum("bk,hbd->hkd", oh, z)
        sums = part if sums is None else sums + part
        c = oh.sum(0)
        counts = c if counts is None else counts + c
    if counts is None or bool((counts == 0).any()):
        raise ValueError("class statistics need at least one sample of every class")
    mean = sums / counts[:, None]
    dev_p = dev_2 = None
    pieces = ((zp, yp) for z, y in chunks() for zp, yp in zip(z.split(PIECE_ROWS, -2), y.split(PIECE_ROWS)))
    for z, y in pieces:
        oh = _onehot(y, num_classes, z.dtype)
        diff = z - (oh @ mean if num_classes <= GATHER_ABOVE else mean[..., y, :])  # z − μ_y [.., b, d]
        a, b = lp_sq(diff, p) @ oh, lp_sq(diff, 2) @ oh  # [.., K]
        dev_p = a if dev_p is None else dev_p + a
        dev_2 = b if dev_2 is None else dev_2 + b
    s2 = dev_p / counts
    return ClassStats(mean=mean, s2=s2, v=lp_sq(mean, p) + s2, s2_l2=dev_2 / counts, counts=counts)


def batch_class_stats(z: torch.Tensor, y: torch.Tensor, num_classes: int, p: float = 3.0) -> ClassStats:
    """The statistics of the classes present in one batch (z [.., B, d], y [B]), with masks instead of a selection
    (no host sync): a class absent from the batch gets zeros and ``counts`` 0; a class of one sample ŝ² = 0."""
    oh = _onehot(y, num_classes, z.dtype)  # [B, K]
    counts = oh.sum(0)
    mean = (oh.T @ z if z.ndim == 2 else torch.einsum("bk,hbd->hkd", oh, z)) / counts.clamp_min(1)[:, None]
    diff = z - mean.index_select(-2, y)
    s2 = (lp_sq(diff, p) @ oh) / counts.clamp_min(1)
    s2_l2 = (lp_sq(diff, 2) @ oh) / counts.clamp_min(1)
    return ClassStats(mean=mean, s2=s2, v=lp_sq(mean, p) + s2, s2_l2=s2_l2, counts=counts)


def _per_head(x: float | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A scalar or a per-head vector [H], shaped to broadcast against ``like`` [H, K]."""
    t = torch.as_tensor(x, dtype=like.dtype, device=like.device)
    return t.reshape(t.shape + (1,) * (like.ndim - t.ndim))


def margins(v: torch.Tensor, c_bar: float | torch.Tensor = 1.0, exponent: float | torch.Tensor = 1 / 3
            ) -> torch.Tensor:
    """γ_k = c̄ · K · v_k^e / Σ_j v_j^e over the last axis (the mean of γ is c̄); c̄, e scalar or per head."""
    w = v.clamp_min(0).pow(_per_head(exponent, v))
    return _per_head(c_bar, v) * v.shape[-1] * w / w.sum(-1, keepdim=True)
