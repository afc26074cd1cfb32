"""Exact probes (../shared/spec/protocol.md, "Exact probes"): what the features allow without loss
engineering. They sit beside the trained methods; their hyperparameter is chosen on val, test is scored once.

``logreg``  multinomial L2 logistic regression, exactly sklearn's ``LogisticRegression(C)`` objective

                minimise_{W, b}   Σ_i CE(W x_i + b, y_i)  +  ‖W‖² / (2C)        (b is not penalised)
            ⇔   minimise         mean_i CE_i  +  ‖W‖² / (2 C n)

            solved full batch by L-BFGS (:func:`lbfgs`: a Wolfe line search that falls back on gradients
            where float32 loss values stop resolving decreases) from zero, in the features' dtype, on the raw
            features (no implicit scaling, like sklearn; ``standardize=True`` gives sklearn's
            ``make_pipeline(StandardScaler(), LogisticRegression(C))``). C is chosen on val over a log grid
            (default 10^-4 … 10^2, half-decade steps), fitted from the strongest regularisation to the weakest,
            each fit warm-started from the previous solution. Stops when max|∇| ≤ tol on the mean-form
            objective (sklearn's ``tol`` criterion; default 1e-6, sklearn's is 1e-4; float32 reaches ≈ 1e-7),
            or after ``max_iter`` = 1000 iterations (history 20 pairs). K = 2 still fits two rows of W
            (softmax); its optimum is sklearn's binary ``LogisticRegression(C = 2C)``.
``logreg_balanced``  logreg with sklearn's ``class_weight="balanced"``: each sample's CE weighted by
            s_i = n / (K' · n_{y_i}) (K' the classes present in train, n_k their counts; Σ_i s_i = n),

                minimise   mean_i s_i · CE_i  +  ‖W‖² / (2 C n)

            = ``LogisticRegression(C, class_weight="balanced")``: a long-tail reference (every class weighs the
            same in the loss), C chosen on val as for logreg.
``knn``     cosine kNN with temperature-weighted votes, as in DINO's ``eval_knn`` (Caron et al., 2021):

                s_j = <x/‖x‖, x_j/‖x_j‖>,   votes_c = Σ_{j ∈ top-k(s)} [y_j = c] · exp(s_j / T),   ŷ = argmax_c votes_c

            T = 0.07 by default; ``weighting="uniform"`` counts every neighbour once (sklearn's
            ``weights="uniform"``). k is chosen on val from {10, 20, 50, 100, 200} (clipped to N).

Ties: a tied vote goes to the lowest class index (``argmax``, as sklearn's ``predict``); equal similarities at
the k-th place are broken by ``torch.topk``, which need not pick the same neighbour as sklearn. Selection: first
best grid point in grid order (ascending C, ascending k by default). The final model is trained on train only;
under ``--refit`` it is fitted again on train ∪ val at the chosen C / k (:func:`refit_reference_probe`).

On CPU every result is deterministic; on CUDA the kNN vote sums use atomic adds (bitwise noise, so an exact
vote tie may resolve differently between runs).
"""
from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from .errors import UserError
from .metrics import per_class_accuracy
from .registry import Registry
from .settings import TRAIN

REFERENCE_PROBES = ("logreg", "logreg_balanced", "knn")
CLASS_WEIGHTS = (None, "balanced")  # logreg's class weighting: none, or sklearn's "balanced"
SELECT = TRAIN["select"].choices  # the val scores a grid point is selected on
DEFAULT_CS: tuple[float, ...] = tuple(float(c) for c in np.logspace(-4, 2, 13))
DEFAULT_KS: tuple[int, ...] = (10, 20, 50, 100, 200)
DEFAULT_TEMPERATURE = 0.07
CHUNK_ELEMENTS = 1 << 24  # bound on the [rows, K] (logreg) and [queries, N] (knn) temporaries, in elements


@dataclass
class ProbeResult:
    """A fitted exact probe: the chosen hyperparameters, the whole val grid and the predictions."""

    name: str
    hparams: dict[str, Any]  # the chosen grid point
    grid: list[dict[str, Any]]  # in grid order: {"hparams": {...}, "val_score": float, "info": {...}}
    val_pred: np.ndarray  # [N_val] int64, of the chosen grid point
    test_pred: np.ndarray | None  # [N_test] int64 (None without test_x)
    val_score: float  # of the chosen grid point, in [0, 1]
    info: dict[str, Any] = field(default_factory=dict)  # JSON-able: select, device, wall_s, fit details
    model: Any = None  # the chosen :class:`LogRegModel` or :class:`KNNModel` (not JSON-able)


@runtime_checkable
class ExactProbe(Protocol):
    """What ``PROBES`` holds: a function ``(x, y, val_x, val_y, test_x, num_classes, select, **options) ->
    ProbeResult`` whose keyword-only parameters are its options (:func:`fit_reference_probe` checks them)."""

    def __call__(self, x: torch.Tensor, y: torch.Tensor, val_x: torch.Tensor, val_y: torch.Tensor,
                 test_x: torch.Tensor | None, num_classes: int, select: str = "acc", **options: Any
                 ) -> ProbeResult: ...


PROBES: Registry[ExactProbe] = Registry("exact probe", base=ExactProbe)


def score(pred: np.ndarray, y: np.ndarray, num_classes: int, select: str = "acc") -> float:
    """``acc``: mean(pred = y); ``macc``: mean over the classes present in y of acc_k."""
    if select == "acc":
        return float(np.mean(pred == y)) if len(y) else float("nan")
    if select == "macc":
        acc = per_class_accuracy(pred, y, num_classes)
        return float(np.nanmean(acc)) if np.isfinite(acc).any() else float("nan")
    raise UserError(f"select must be one of {', '.join(SELECT)}, got {select!r}")


def _first_best(scores: Sequence[float]) -> int:
    """Index of the first maximal score (NaN counts as worst)."""
    best, best_i = -math.inf, 0
    for i, s in enumerate(scores):
        if s > best:  # strict: the first of equal scores wins; NaN never wins
            best, best_i = s, i
    return best_i


def _chunk_rows(width: int, chunk_elements: int = CHUNK_ELEMENTS) -> int:
    return max(1, chunk_elements // max(1, width))


# ---- logistic regression -------------------------------------------------------------------------------------

@dataclass
class LogRegModel:
    """logits = ((x − mean) / scale) Wᵀ + b; ``mean``/``scale`` are None unless fitted with ``standardize``."""

    weight: torch.Tensor  # [K, D]
    bias: torch.Tensor  # [K]
    C: float
    n_iter: int = 0
    grad_max: float = float("nan")  # max|∇| of the mean-form objective at the returned point
    converged: bool = False
    stop: str = ""  # tol | max_iter | line_search
    mean: torch.Tensor | None = None
    scale: torch.Tensor | None = None

    def _prep(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.weight.device)
        return x if self.mean is None else (x - self.mean) / self.scale

    @torch.no_grad()
    def logits(self, x: torch.Tensor, chunk_rows: int | None = None) -> torch.Tensor:
        x = self._prep(x)
        rows = chunk_rows or _chunk_rows(self.weight.shape[0])
        w, b = self.weight, self.bias
        parts = [torch.addmm(b, x[i:i + rows].to(w.dtype), w.T) for i in range(0, len(x), rows)]
        return torch.cat(parts) if parts else w.new_zeros(0, w.shape[0])

    def predict_proba(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits(x).softmax(-1)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits(x).argmax(-1)


def logreg_objective(weight: torch.Tensor, bias: torch.Tensor, x: torch.Tensor, y: torch.Tensor, C: float,
                     chunk_rows: int | None = None, center: torch.Tensor | None = None,
                     sample_weight: torch.Tensor | None = None) -> tuple[float, torch.Tensor, torch.Tensor]:
    """Mean-form objective f = mean_i s_i CE_i + ‖W‖²/(2Cn) and its gradient (∂f/∂W, ∂f/∂b), in row chunks;
    s_i = ``sample_weight`` (default 1).

    ∂f/∂W = (P − Y)ᵀ S X / n + W / (C n),   ∂f/∂b = Σ_i s_i (p_i − y_i) / n,   P = softmax(X Wᵀ + b), S = diag(s).
    With ``center`` = μ the logits are (X − μ) Wᵀ + b, computed without a centred copy of X: an exact
    reparametrisation (b is not penalised; b_raw = b − W μ) that conditions L-BFGS far better when features
    share a large mean."""
    n, k = len(x), weight.shape[0]
    rows = chunk_rows or _chunk_rows(k)
    loss = torch.zeros((), dtype=torch.float64, device=x.device)
    g_w, g_b = torch.zeros_like(weight), torch.zeros_like(bias)
    with torch.no_grad():
        b_raw = bias if center is None else bias - weight @ center.to(weight.dtype)
        for i in range(0, n, rows):
            xc, yc = x[i:i + rows].to(weight.dtype), y[i:i + rows]
            z = torch.addmm(b_raw, xc, weight.T)
            lse = torch.logsumexp(z, dim=1)
            ce = lse - z.gather(1, yc[:, None])[:, 0]
            p = (z - lse[:, None]).exp_()
            p[torch.arange(len(yc), device=x.device), yc] -= 1.0
            if sample_weight is not None:
                sc = sample_weight[i:i + rows].to(weight.dtype)
                ce, p = ce * sc, p.mul_(sc[:, None])
            loss += ce.sum(dtype=torch.float64)
            g_w.addmm_(p.T, xc)
            g_b += p.sum(0)
        if center is not None:
            g_w.sub_(torch.outer(g_b, center.to(weight.dtype)))
        lam = 1.0 / (C * n)
        loss = loss / n + 0.5 * lam * weight.double().pow(2).sum()
        g_w.div_(n).add_(weight, alpha=lam)
        g_b.div_(n)
    return float(loss), g_w, g_b


def lbfgs(fg: Callable[[torch.Tensor], tuple[float, torch.Tensor]], theta: torch.Tensor, max_iter: int = 1000,
          tol: float = 1e-6, history_size: int = 20, max_ls: int = 25,
          grad_max: Callable[[torch.Tensor], float] | None = None) -> tuple[torch.Tensor, int, str]:
    """Minimise a smooth convex f by L-BFGS (two-loop recursion) from ``theta``; ``fg(θ) -> (f, ∇f)``.

    Stops when ``grad_max(∇f)`` (default max|∇f|) ≤ tol.
    Line search: weak Wolfe, φ'(t) ≥ 0.9 φ'(0) with sufficient decrease φ(t) ≤ φ(0) + 1e-4 t φ'(0) — or, where
    f is flat to its rounding (φ(t) ≤ φ(0) + 1e-6 |φ(0)|), Hager–Zhang's approximate Wolfe test
    φ'(t) ≤ −0.8 φ'(0), which needs only gradients: float32 loss values stop resolving decreases near
    max|∇| ≈ 1e-5, float32 gradients do not. Doubling until bracketed, then safeguarded secant steps on φ'.
    A failed line search drops the curvature pairs and retries from steepest descent; a second failure stops.
    Returns (θ, iterations, stop reason: ``tol`` | ``max_iter`` | ``line_search``)."""
    gmax = grad_max or (lambda g_: float(g_.abs().max()))
    f, g = fg(theta)
    S: list[torch.Tensor] = []
    Yv: list[torch.Tensor] = []
    rho: list[float] = []
    it = 0
    while gmax(g) > tol:
        if it >= max_iter:
            return theta, it, "max_iter"
        q = g.clone()
        alphas = []
        for s, y, r in zip(reversed(S), reversed(Yv), reversed(rho)):
            a_ = r * float(s.dot(q))
            alphas.append(a_)
            q.add_(y, alpha=-a_)
        q.mul_(float(S[-1].dot(Yv[-1]) / Yv[-1].dot(Yv[-1])) if S else min(1.0, 1.0 / float(g.abs().sum())))
        for s, y, r, a_ in zip(S, Yv, rho, reversed(alphas)):
            q.add_(s, alpha=a_ - r * float(y.dot(q)))
        d = q.neg_()
        dphi0 = float(g.dot(d))
        if not dphi0 < 0:  # not a descent direction (rounding): restart from steepest descent
            S, Yv, rho = [], [], []
            d = g * -min(1.0, 1.0 / float(g.abs().sum()))
            dphi0 = float(g.dot(d))
        lo, dlo, hi, dhi, t = 0.0, dphi0, math.inf, 0.0, 1.0
        found = None
        for _ in range(max_ls):
            new = theta + t * d
            fn, gn = fg(new)
            dn = float(gn.dot(d))
            decrease = fn <= f + 1e-4 * t * dphi0 or (fn <= f + 1e-6 * abs(f) and dn <= -0.8 * dphi0)
            if decrease and dn >= 0.9 * dphi0:
                found = (new, fn, gn)
                break
            if decrease and dn < 0:  # too short
                lo, dlo, found = t, dn, (new, fn, gn)
            else:  # too long
                hi, dhi = t, dn
            if math.isinf(hi):
                t *= 2.0
            else:
                w = hi - lo
                sec = lo - dlo * w / (dhi - dlo) if dhi > dlo else lo + 0.5 * w
                t = min(max(sec, lo + 0.1 * w), hi - 0.1 * w)
        if found is None:
            if not S:
                return theta, it, "line_search"
            S, Yv, rho = [], [], []  # a stale curvature model: retry once from steepest descent
            continue
        new, fn, gn = found
        s, y = new - theta, gn - g
        sy = float(s.dot(y))
        if sy > 1e-10 * float(s.norm() * y.norm()):  # keep the pair only where curvature is positive
            S, Yv, rho = (S + [s])[-history_size:], (Yv + [y])[-history_size:], (rho + [1.0 / sy])[-history_size:]
        theta, f, g = new, fn, gn
        it += 1
    return theta, it, "tol"


def fit_logreg(x: torch.Tensor, y: torch.Tensor, num_classes: int, C: float, *, max_iter: int = 1000,
               tol: float = 1e-6, history_size: int = 20, init: LogRegModel | None = None,
               standardize: bool = False, chunk_rows: int | None = None, class_weight: str | None = None
               ) -> LogRegModel:
    """Minimise mean_i s_i CE_i + ‖W‖²/(2Cn) by full-batch :func:`lbfgs`, from zero (sklearn's start) or ``init``;
    s_i = 1, or with ``class_weight="balanced"`` :func:`balanced_weights` (sklearn's ``class_weight``).

    Works in x's dtype and on x's device, in the centred parametrisation of :func:`logreg_objective` (2–3×
    fewer iterations on encoder features, the same optimum); stops at max|∇| ≤ tol (sklearn's ``tol``, on the
    same mean-form objective; sklearn's default is 1e-4), after ``max_iter`` iterations or when the line search
    fails; the test is on the gradient in the raw parametrisation (W, b), as sklearn's."""
    C = _c(C)
    max_iter = int(_number(max_iter, "logreg", "max_iter", integer=True))
    history_size = int(_number(history_size, "logreg", "history_size", integer=True))
    tol = _number(tol, "logreg", "tol")
    chunk_rows = _rows(chunk_rows, "logreg")
    x, y = _as_xy(x, y, num_classes, "train")
    sw = balanced_weights(y, num_classes).to(x.dtype) if _class_weight(class_weight) else None
    mean = scale = None
    if init is not None and init.mean is not None:
        mean, scale = init.mean, init.scale
    elif standardize:
        mean = x.mean(0)
        scale = x.std(0, unbiased=False)
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # constant feature: StandardScaler's rule
    if mean is not None:
        x = (x - mean) / scale
    k, d = num_classes, x.shape[1]
    mu = x.mean(0) if mean is None else None  # standardised features are centred already
    theta = x.new_zeros(k * d + k)
    if init is not None:
        if tuple(init.weight.shape) != (k, d):
            raise UserError(f"logreg: warm start has shape {tuple(init.weight.shape)}, expected {(k, d)}")
        w0, b0 = init.weight.to(theta), init.bias.to(theta)
        theta = torch.cat([w0.reshape(-1), b0 if mu is None else b0 + w0 @ mu])

    def fg(th: torch.Tensor) -> tuple[float, torch.Tensor]:
        f, g_w, g_b = logreg_objective(th[:k * d].view(k, d), th[k * d:], x, y, C, chunk_rows, mu, sw)
        return f, torch.cat([g_w.reshape(-1), g_b])

    def raw_grad_max(g: torch.Tensor) -> float:  # sklearn's test, in the raw (uncentred) parametrisation
        g_w, g_b = g[:k * d].view(k, d), g[k * d:]
        g_w = g_w if mu is None else g_w + torch.outer(g_b, mu)
        return float(max(g_w.abs().max(), g_b.abs().max()))

    theta, n_iter, stop = lbfgs(fg, theta, max_iter, tol, history_size, grad_max=raw_grad_max)
    weight, bias = theta[:k * d].view(k, d).clone(), theta[k * d:].clone()
    if mu is not None:
        bias = bias - weight @ mu
    _, g_w, g_b = logreg_objective(weight, bias, x, y, C, chunk_rows, sample_weight=sw)
    grad_max = float(max(g_w.abs().max(), g_b.abs().max()))
    return LogRegModel(weight, bias, float(C), n_iter, grad_max, grad_max <= tol, stop, mean, scale)


def balanced_weights(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """sklearn's ``class_weight="balanced"`` per sample: s_i = n / (K' · n_{y_i}), K' = #classes present in y."""
    counts = torch.bincount(y, minlength=num_classes).double()
    w = len(y) / (int((counts > 0).sum()) * counts.clamp_min(1))
    return w[y]


@PROBES.register("logreg", help="multinomial L2 logistic regression, full-batch L-BFGS, C on val")
def _logreg_probe(x: torch.Tensor, y: torch.Tensor, val_x: torch.Tensor, val_y: torch.Tensor,
                  test_x: torch.Tensor | None, num_classes: int, select: str = "acc", *,
                  Cs: Sequence[float] = DEFAULT_CS, C: float | None = None, max_iter: int = 1000, tol: float = 1e-6,
                  history_size: int = 20, standardize: bool = False, chunk_rows: int | None = None
                  ) -> ProbeResult:
    """Fit every C of the grid (ascending, warm-started), score on val, keep the first best."""
    return _logreg_grid("logreg", None, x, y, val_x, val_y, test_x, num_classes, select, Cs=Cs, C=C,
                        max_iter=max_iter, tol=tol, history_size=history_size, standardize=standardize,
                        chunk_rows=chunk_rows)


@PROBES.register("logreg_balanced", help="logreg with sklearn's class_weight=\"balanced\" (long-tail reference)")
def _logreg_balanced_probe(x: torch.Tensor, y: torch.Tensor, val_x: torch.Tensor, val_y: torch.Tensor,
                           test_x: torch.Tensor | None, num_classes: int, select: str = "acc", *,
                           Cs: Sequence[float] = DEFAULT_CS, C: float | None = None, max_iter: int = 1000,
                           tol: float = 1e-6, history_size: int = 20, standardize: bool = False,
                           chunk_rows: int | None = None) -> ProbeResult:
    """logreg with each sample's CE weighted by n / (K' · n_{y_i}); C on val as for logreg."""
    return _logreg_grid("logreg_balanced", "balanced", x, y, val_x, val_y, test_x, num_classes, select, Cs=Cs,
                        C=C, max_iter=max_iter, tol=tol, history_size=history_size, standardize=standardize,
                        chunk_rows=chunk_rows)


def _logreg_grid(name: str, class_weight: str | None, x: torch.Tensor, y: torch.Tensor, val_x: torch.Tensor,
                 val_y: torch.Tensor, test_x: torch.Tensor | None, num_classes: int, select: str, *,
                 Cs: Sequence[float], C: float | None, max_iter: int, tol: float, history_size: int,
                 standardize: bool, chunk_rows: int | None) -> ProbeResult:
    """Fit every C of the grid (ascending, warm-started) with ``class_weight``, score on val, keep the first
    best."""
    grid = [_c(c) for c in ([C] if C is not None else _as_list(Cs, "logreg", "Cs"))]
    val_np = val_y.cpu().numpy()
    fits: dict[int, tuple[LogRegModel, np.ndarray, float]] = {}
    model: LogRegModel | None = None
    for i in sorted(range(len(grid)), key=lambda j: grid[j]):  # largest regularisation first
        model = fit_logreg(x, y, num_classes, grid[i], max_iter=max_iter, tol=tol, history_size=history_size,
                           init=model, standardize=standardize, chunk_rows=chunk_rows, class_weight=class_weight)
        pred = model.predict(val_x).cpu().numpy()
        fits[i] = (model, pred, score(pred, val_np, num_classes, select))
    rows = [{"hparams": {"C": grid[i]}, "val_score": fits[i][2],
             "info": {"n_iter": fits[i][0].n_iter, "grad_max": fits[i][0].grad_max,
                      "converged": fits[i][0].converged, "stop": fits[i][0].stop}} for i in range(len(grid))]
    best = _first_best([r["val_score"] for r in rows])
    chosen, val_pred, val_score = fits[best]
    test_pred = chosen.predict(test_x).cpu().numpy() if test_x is not None else None
    return ProbeResult(name, {"C": grid[best]}, rows, val_pred, test_pred, val_score,
                       {"standardize": standardize, "class_weight": class_weight or "none", "tol": tol,
                        "max_iter": max_iter, "converged": chosen.converged,
                        "n_iter_total": sum(f[0].n_iter for f in fits.values())}, model=chosen)


# ---- kNN -----------------------------------------------------------------------------------------------------

def _normalise(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)


def knn_votes(train_x: torch.Tensor, train_y: torch.Tensor, query_x: torch.Tensor, num_classes: int,
              ks: Sequence[int], temperature: float = DEFAULT_TEMPERATURE, weighting: str = "temperature",
              chunk_rows: int | None = None) -> dict[int, torch.Tensor]:
    """Class votes [N_query, K] for every k: Σ_{j ∈ top-k} [y_j = c] · w_j with w_j = exp((s_j − s_max) / T)
    (``temperature``; the factor exp(−s_max/T) of each query leaves argmax unchanged and keeps exp finite) or 1
    (``uniform``), s = cosine similarity. One similarity matmul and top-k per chunk of queries."""
    _check_weighting(weighting)
    temperature = _t(temperature) if weighting == "temperature" else temperature
    ks = [_k(k) for k in ks]
    chunk_rows = _rows(chunk_rows, "knn")
    n = len(train_x)
    if max(ks) > n:
        raise UserError(f"knn: k = {max(ks)} exceeds the {n} training samples")
    xn = _normalise(train_x.float())
    train_y = train_y.to(xn.device).long()
    qn = _normalise(query_x.to(xn.device).float())
    kmax = max(ks)
    out = {k: qn.new_zeros(len(qn), num_classes) for k in ks}
    rows = chunk_rows or _chunk_rows(n)
    for i in range(0, len(qn), rows):
        sim, idx = (qn[i:i + rows] @ xn.T).topk(kmax, dim=1, largest=True, sorted=True)
        if weighting == "temperature":
            w = ((sim - sim[:, :1]) / temperature).exp_()
        else:
            w = torch.ones_like(sim)
        labels = train_y[idx]
        for k in ks:
            out[k][i:i + rows].scatter_add_(1, labels[:, :k], w[:, :k])
    return out


def knn_predict(train_x: torch.Tensor, train_y: torch.Tensor, query_x: torch.Tensor, num_classes: int, k: int,
                temperature: float = DEFAULT_TEMPERATURE, weighting: str = "temperature") -> torch.Tensor:
    """argmax_c of :func:`knn_votes` (lowest class index on a tie)."""
    return knn_votes(train_x, train_y, query_x, num_classes, [k], temperature, weighting)[k].argmax(1)


@dataclass
class KNNModel:
    """A fitted kNN probe: its training rows and chosen k. Class scores are the vote shares

        p_c(x) = votes_c(x) / Σ_c' votes_c'(x)        (:func:`knn_votes`; sklearn's ``predict_proba``)

    so argmax p = the kNN prediction and top-5 accuracy is defined (classes no neighbour votes for score 0)."""

    x: torch.Tensor  # [N, D] training features
    y: torch.Tensor  # [N] training labels
    num_classes: int
    k: int
    temperature: float = DEFAULT_TEMPERATURE
    weighting: str = "temperature"
    chunk_rows: int | None = None

    def votes(self, x: torch.Tensor) -> torch.Tensor:
        """[N, K] :func:`knn_votes` of the queries ``x`` at the chosen k."""
        return knn_votes(self.x, self.y, x, self.num_classes, [self.k], self.temperature, self.weighting,
                         self.chunk_rows)[self.k]

    def predict_proba(self, x: torch.Tensor) -> torch.Tensor:
        votes = self.votes(x)
        return votes / votes.sum(1, keepdim=True)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The scores ranked for top-k accuracy: the vote shares (:meth:`predict_proba`)."""
        return self.predict_proba(x)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """argmax_c votes_c (lowest class index on a tie), as :func:`knn_predict`."""
        return self.votes(x).argmax(1)


@PROBES.register("knn", help="cosine kNN, temperature-weighted votes (DINO), k on val")
def _knn_probe(x: torch.Tensor, y: torch.Tensor, val_x: torch.Tensor, val_y: torch.Tensor,
               test_x: torch.Tensor | None, num_classes: int, select: str = "acc", *,
               ks: Sequence[int] = DEFAULT_KS, k: int | None = None, temperature: float = DEFAULT_TEMPERATURE,
               weighting: str = "temperature", chunk_rows: int | None = None) -> ProbeResult:
    """Score every k of the grid (clipped to N, duplicates dropped) on val, keep the first best."""
    _check_weighting(weighting)
    temperature = _t(temperature) if weighting == "temperature" else temperature
    grid: list[int] = []
    for kk in ([k] if k is not None else _as_list(ks, "knn", "ks")):
        kk = min(_k(kk), len(x))
        if kk not in grid:
            grid.append(kk)
    x, y = _as_xy(x, y, num_classes, "train")
    votes = knn_votes(x, y, val_x, num_classes, grid, temperature, weighting, chunk_rows)
    val_np = val_y.cpu().numpy()
    preds = [votes[kk].argmax(1).cpu().numpy() for kk in grid]
    rows = [{"hparams": {"k": kk}, "val_score": score(p, val_np, num_classes, select), "info": {}}
            for kk, p in zip(grid, preds)]
    best = _first_best([r["val_score"] for r in rows])
    model = KNNModel(x, y, num_classes, grid[best], temperature, weighting, chunk_rows)
    test_pred = None if test_x is None else model.predict(test_x).cpu().numpy()
    hp = {"k": grid[best], "temperature": temperature if weighting == "temperature" else None,
          "weighting": weighting}
    return ProbeResult("knn", hp, rows, preds[best], test_pred, rows[best]["val_score"],
                       {"weighting": weighting, "temperature": temperature}, model=model)


# ---- the common entry point ----------------------------------------------------------------------------------

def fit_reference_probe(name: str, x: torch.Tensor, y: torch.Tensor, val_x: torch.Tensor, val_y: torch.Tensor,
                        test_x: torch.Tensor | None, num_classes: int, select: str = "acc",
                        device: torch.device | str | None = None, **overrides: Any) -> ProbeResult:
    """Fit exact probe ``name`` (``logreg`` | ``knn``) on (x, y), choose its hyperparameter on (val_x, val_y)
    by ``select`` (``acc`` | ``macc``), predict val and test. ``overrides`` are the probe's keyword options
    (logreg: Cs, C, max_iter, tol, history_size, standardize, chunk_rows; knn: ks, k, temperature, weighting,
    chunk_rows). Tensors go to ``device`` (default: where x is), features as float32."""
    fn = PROBES.get(name)
    if select not in SELECT:
        raise UserError(f"select must be one of {', '.join(SELECT)}, got {select!r}")
    if not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
        raise UserError(f"num_classes must be an integer ≥ 1, got {num_classes!r}")
    allowed = [p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY]
    unknown = sorted(set(overrides) - set(allowed))
    if unknown:
        raise UserError(f"{name}: unknown option(s) {', '.join(unknown)}; known: {', '.join(allowed)}")
    dev = torch.device(device) if device is not None else torch.as_tensor(x).device
    x_, vx = torch.as_tensor(x).to(dev, torch.float32), torch.as_tensor(val_x).to(dev, torch.float32)
    tx = None if test_x is None else torch.as_tensor(test_x).to(dev, torch.float32)
    y_, vy = torch.as_tensor(y).to(dev, torch.long), torch.as_tensor(val_y).to(dev, torch.long)
    _as_xy(x_, y_, int(num_classes), "train")
    _as_xy(vx, vy, int(num_classes), "val", dim=x_.shape[1])
    if tx is not None and (tx.ndim != 2 or tx.shape[1] != x_.shape[1]):
        raise UserError(f"{name}: test features have shape {tuple(tx.shape)}, expected [N, {x_.shape[1]}]")
    t0 = time.perf_counter()
    res = fn(x_, y_, vx, vy, tx, int(num_classes), select, **overrides)
    res.info.update({"select": select, "device": str(dev), "wall_s": time.perf_counter() - t0})
    return res


def chosen_options(res: ProbeResult) -> dict[str, Any]:
    """The options that fit exact probe ``res.name`` at its chosen grid point alone: ``C`` (logreg), or ``k`` with
    its weighting and temperature (knn)."""
    hp = res.hparams
    if res.name == "knn":
        return {"k": hp["k"], "weighting": hp["weighting"],
                **({"temperature": hp["temperature"]} if hp.get("temperature") is not None else {})}
    return {"C": hp["C"]}


def refit_reference_probe(res: ProbeResult, x: torch.Tensor, y: torch.Tensor, val_x: torch.Tensor,
                          val_y: torch.Tensor, test_x: torch.Tensor | None, num_classes: int, select: str = "acc",
                          device: torch.device | str | None = None) -> ProbeResult:
    """Exact probe ``res`` fitted again on (x, y) — train ∪ val under ``--refit`` — at the hyperparameters chosen
    on val (:func:`chosen_options`): a one-point grid, so val plays no part in it (its val score is no longer
    held out)."""
    return fit_reference_probe(res.name, x, y, val_x, val_y, test_x, num_classes, select, device,
                               **chosen_options(res))


# ---- validation ------------------------------------------------------------------------------------------------

def _class_weight(v: str | None) -> bool:
    """Whether logreg weights classes (``"balanced"``); another value is a UserError."""
    if v not in CLASS_WEIGHTS:
        raise UserError(f"logreg: class_weight must be none or 'balanced', got {v!r}")
    return v is not None


def _as_xy(x: torch.Tensor, y: torch.Tensor, num_classes: int, split: str,
           dim: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    if x.ndim != 2 or (dim is not None and x.shape[1] != dim):
        raise UserError(f"{split} features have shape {tuple(x.shape)}, expected [N, {dim or 'D'}]")
    if y.ndim != 1 or len(y) != len(x):
        raise UserError(f"{split} labels have shape {tuple(y.shape)}, expected [{len(x)}]")
    if len(x) == 0:
        raise UserError(f"{split} split is empty")
    if int(y.min()) < 0 or int(y.max()) >= num_classes:
        raise UserError(f"{split} labels must lie in [0, {num_classes}), got [{int(y.min())}, {int(y.max())}]")
    return x, y.long()


def _as_list(v: Any, probe: str, name: str) -> list:
    vals = [v] if np.isscalar(v) else list(v)
    if not vals:
        raise UserError(f"{probe}: {name} is empty")
    return vals


def _number(v: Any, probe: str, name: str, integer: bool = False) -> float:
    """v as a finite number > 0 (an integer ≥ 1 if ``integer``), from a number or numeric text, else UserError."""
    what = "an integer ≥ 1" if integer else "a finite number > 0"
    try:
        f = float(v) if not isinstance(v, bool) else math.nan
    except (TypeError, ValueError):
        f = math.nan
    if not (math.isfinite(f) and f > 0 and (not integer or (f == int(f) and f >= 1))):
        raise UserError(f"{probe}: {name} must be {what}, got {v!r}")
    return int(f) if integer else f


def _c(v: Any) -> float:
    return _number(v, "logreg", "C")


def _k(v: Any) -> int:
    return int(_number(v, "knn", "k", integer=True))


def _t(v: Any) -> float:
    return _number(v, "knn", "temperature")


def _rows(v: Any, probe: str) -> int | None:
    return None if v is None else int(_number(v, probe, "chunk_rows", integer=True))


def _check_weighting(w: str) -> None:
    if w not in ("temperature", "uniform"):
        raise UserError(f"knn: weighting must be 'temperature' or 'uniform', got {w!r}")
