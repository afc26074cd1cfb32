"""scikit-learn estimators: one probe (any method, head, adapter) trained on a feature matrix.

``ProbeClassifier`` wraps :func:`mr2probe.trainer.train_stack` with a single :class:`RunSpec` (after choosing
lr × weight decay on an internal hold-out, the way ``LogisticRegressionCV`` chooses C), so it composes with
``Pipeline``, ``GridSearchCV``, ``cross_val_score`` and friends::

    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    clf = make_pipeline(StandardScaler(), mr2probe.MR2Classifier(c_bar=2.0)).fit(X, y)
"""
from __future__ import annotations

import inspect
import math
from typing import Any, Callable

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from .errors import UserError
from .settings import TRAIN, estimator_settings
from .heads import ProbeConfig, ProbeStack
from .experiment import holdout_val, select_scores
from .trainer import TrainConfig, TrainData, expand_runs, pick_device, train_stack


SETTINGS = [(name, s.estimator) for name, s in estimator_settings().items()]  # declared in mr2probe.settings


def estimator_init(params: list[tuple[str, Any]]) -> Callable[..., None]:
    """An ``__init__`` taking exactly ``params`` (name, default) as keyword arguments and storing each unchanged
    (scikit-learn's contract: ``get_params``, ``clone`` and ``check_estimator`` read its signature). Generated so
    that the training settings are declared once, in :data:`mr2probe.settings.TRAIN`."""
    names = [n for n, _ in params]

    def __init__(self, **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - set(names))
        if unknown:
            raise TypeError(f"{type(self).__name__}() got unexpected parameter(s) {', '.join(unknown)}; it takes "
                            f"{', '.join(names)}")
        for name, default in params:
            setattr(self, name, kwargs.get(name, default))

    P = inspect.Parameter
    __init__.__signature__ = inspect.Signature([P("self", P.POSITIONAL_OR_KEYWORD)]
                                               + [P(n, P.KEYWORD_ONLY, default=d) for n, d in params])
    return __init__


def _grid(value: Any, default: tuple[float, ...]) -> tuple[float, ...]:
    """A parameter that is one number, a sequence of numbers (a grid) or None (the default grid)."""
    if value is None:
        return default
    return tuple(float(v) for v in value) if isinstance(value, (tuple, list)) else (float(value),)


class ProbeClassifier(ClassifierMixin, BaseEstimator):
    """A probe (adapter ∘ head) trained with one mr2probe method on features ``X`` [n, D], labels ``y``.

    Parameters (keyword-only, stored unchanged, checked at ``fit``): ``method`` (see ``mr2probe methods``),
    ``head`` (linear | cosine), ``adapter`` (none | linear | mlp), then the training settings of
    :data:`mr2probe.settings.TRAIN` that an estimator takes, under the same names as the CLI flags and suite keys
    (``epochs``, ``min_steps`` — the budget is max(epochs · ⌈n / batch_size⌉, min_steps) AdamW steps, cosine
    schedule —, ``batch_size``, ``lr``, ``wd``, ``l2``, ``width``, ``scale``, ``val_fraction``, ``device``), then
    ``seed`` (init and data order) and ``method_params`` (dict of the method's own hyperparameters, e.g.
    ``{"gamma": 1.0}`` for focal; unset ones take the method's defaults).

    Converges with its defaults, like sklearn's ``LogisticRegression``: the regulariser is a coupled L2 penalty
    ½·l2·‖W‖² on the linear head's weights (the objective of L2 logistic regression with l2 = 1/(C·n); AdamW's
    decoupled weight decay ``wd`` is 0 by default: it does not converge to that optimum). ``lr``, ``wd`` and
    ``l2`` default to None = the grids (1e-2, 1e-1) × (0) × (1e-4, 1e-3, 1e-2) (l2 is 0 for a cosine head,
    whose weights are normalised; it then searches wd (1e-4, 1e-1) instead); ``scale`` (cosine head) is 16 or a
    grid; with more than one grid
    point, all points are trained together (one stack) on a stratified ``val_fraction`` (0.2, seed 0) hold-out
    of ``X``, the best point on its accuracy is kept (``best_params_``) and the probe is refit on all of ``X``
    with it. A number (or a one-element list) fixes the value; a list is a grid. The method's own grid is not
    searched (that is ``GridSearchCV``'s job, as is every other parameter).

    Fitted attributes: ``classes_`` (sorted labels: strings, integers, any sortable values), ``n_features_in_``,
    ``best_params_`` ({"lr", "wd", "l2"}, and "scale" for a cosine head), ``probe_`` (the trained
    :class:`~mr2probe.heads.ProbeStack` with one head, float64 on CPU), ``info_`` (the method's per-run info, e.g.
    MR2 margins), and for a linear head without adapter ``coef_`` [K, D] and ``intercept_`` [K] (softmax form: one
    row per class, also for K = 2).

    CDB measures class difficulty on a held-out part of the training set it is given (see ``mr2probe methods``).
    ``decision_function`` returns the logits [n, K], or ``logit₁ − logit₀`` [n] for two classes.

    scikit-learn's ``check_estimator`` (tests/test_estimator.py) passes with the defaults, with these
    exceptions: ``check_sample_weight*`` and ``check_classifiers_one_label_sample_weights`` are not generated
    (``fit`` takes no ``sample_weight``: the methods reweight samples themselves); sklearn itself skips
    ``check_array_api_input`` unless ``SCIPY_ARRAY_API=1`` is set.

    Training data with a single class raises ``ValueError`` (as sklearn's checks allow).
    """

    LRS: tuple[float, ...] = (1e-2, 1e-1)
    L2S: tuple[float, ...] = (1e-4, 1e-3, 1e-2)
    COSINE_WDS: tuple[float, ...] = (1e-4, 1e-1)
    SPEC_KEYS = {"lr": "lr", "wd": "weight_decay", "l2": "l2", "scale": "scale"}  # parameter → RunSpec key

    __init__ = estimator_init([("method", "ce"), ("head", "linear"), ("adapter", "none"), *SETTINGS,
                               ("seed", 0), ("method_params", None)])

    def _method_params(self) -> dict[str, Any]:
        return dict(self.method_params or {})

    def _grids(self) -> dict[str, tuple[float, ...]]:
        """The lr, wd, l2 and (cosine) scale values searched (one value each = no search)."""
        linear = self.head == "linear"
        return {"lr": _grid(self.lr, self.LRS), "wd": _grid(self.wd, (0.0,) if linear else self.COSINE_WDS),
                "l2": _grid(self.l2, self.L2S if linear else (0.0,)), "scale": _grid(self.scale, (16.0,))}

    def _train_config(self, grids: dict[str, tuple[float, ...]]) -> TrainConfig:
        probe = ProbeConfig(head=self.head, adapter=self.adapter, width=int(self.width), scale=grids["scale"][0])
        return TrainConfig(epochs=int(self.epochs), min_steps=int(self.min_steps), batch_size=int(self.batch_size),
                           lr=grids["lr"], wd=grids["wd"], l2=grids["l2"], scale=grids["scale"],
                           method_params={self.method: self._method_params()}, method_grid=False,
                           probe=probe, device=self.device, progress=False)

    def fit(self, X: Any, y: Any) -> "ProbeClassifier":
        """Select lr × weight decay on a hold-out of ``X`` (if a grid), then train one probe on all of it."""
        X, y = validate_data(self, X, y, dtype=[np.float64, np.float32])
        check_classification_targets(y)
        self.classes_, y_enc = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(f"{type(self).__name__} needs samples of at least 2 classes; got 1 class")
        try:
            grids = self._grids()
            TRAIN["val_fraction"].check(float(self.val_fraction), "val_fraction")
            cfg = self._train_config(grids)
            cfg.check()
            device = pick_device(cfg.device)
            x = torch.tensor(X, dtype=torch.float32, device=device)
            yt = torch.as_tensor(y_enc.astype(np.int64), device=device)
            k = len(self.classes_)
            best = {name: values[0] for name, values in grids.items()}
            if math.prod(len(v) for v in grids.values()) > 1:
                keep, held = holdout_val(y_enc, float(self.val_fraction), 0)
                if len(held):  # else (one sample per class): no hold-out is possible, the first point is used
                    kt, ht = torch.as_tensor(keep, device=device), torch.as_tensor(held, device=device)
                    data = TrainData(x[kt], yt[kt], x[ht], yt[ht], k)
                    trained = train_stack(data, expand_runs([self.method], [int(self.seed)], cfg), cfg)
                    scores = select_scores(trained.predict(data.val_x), data.val_y, k, "acc")
                    chosen = trained.specs[int(np.argmax(scores))].params
                    best = {name: chosen.get(self.SPEC_KEYS[name], grids[name][0]) for name in grids}
            cfg = self._train_config({name: (v,) for name, v in best.items()})
            trained = train_stack(TrainData(x, yt, x, yt, k), expand_runs([self.method], [int(self.seed)], cfg), cfg)
        except UserError as e:  # bad hyperparameter or diverged training: sklearn expects ValueError
            raise ValueError(str(e)) from None
        self.best_params_ = best if self.head != "linear" else {k: v for k, v in best.items() if k != "scale"}
        self.probe_: ProbeStack = trained.probe.to(device="cpu", dtype=torch.float64).eval()
        self.probe_.requires_grad_(False)
        self.info_: dict[str, Any] = trained.info[0]
        if self.head == "linear" and self.adapter == "none":
            self.coef_ = self.probe_.head_W[0].numpy().copy()
            self.intercept_ = self.probe_.head_b[0].numpy().copy()
        return self

    def _logits(self, X: Any) -> np.ndarray:
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=[np.float64, np.float32])
        with torch.no_grad():
            return self.probe_(torch.tensor(X, dtype=torch.float64))[1][0].numpy()

    def decision_function(self, X: Any) -> np.ndarray:
        """Logits [n, K]; for two classes ``logit₁ − logit₀`` [n] (> 0 means ``classes_[1]``)."""
        z = self._logits(X)
        return z[:, 1] - z[:, 0] if z.shape[1] == 2 else z

    def predict_proba(self, X: Any) -> np.ndarray:
        """Softmax of the logits, [n, K] in the order of ``classes_``."""
        return np.exp(self.predict_log_proba(X))

    def predict_log_proba(self, X: Any) -> np.ndarray:
        z = self._logits(X)
        z = z - z.max(1, keepdims=True)
        return z - np.log(np.exp(z).sum(1, keepdims=True))

    def predict(self, X: Any) -> np.ndarray:
        z = self._logits(X)
        return self.classes_[z.argmax(1)]


class MR2Classifier(ProbeClassifier):
    """:class:`ProbeClassifier` with ``method="mr2"`` and MR2's main hyperparameters as parameters:
    ``p`` (statistics norm), ``c_bar`` (mean margin c̄), ``lam`` (λ, representation margin weight; only
    used with a trainable adapter). Other MR2 settings (``tau``, ``exponent``, ``stats``...) go in
    ``method_params``; naming p, c_bar or lam there too is a ``ValueError``. ``method`` may be an MR2
    variant with the same hyperparameters (mr2_sqrt, mr2_linear, mr2_uniform, mr2_no_rep)."""

    __init__ = estimator_init([("method", "mr2"), ("p", 3.0), ("c_bar", 1.0), ("lam", 0.1), ("head", "linear"),
                               ("adapter", "none"), *SETTINGS, ("seed", 0), ("method_params", None)])

    def _method_params(self) -> dict[str, Any]:
        extra = dict(self.method_params or {})
        twice = sorted({"p", "c_bar", "lam"} & set(extra))
        if twice:
            raise ValueError(f"set {', '.join(twice)} as MR2Classifier parameters, not in method_params")
        return {"p": float(self.p), "c_bar": float(self.c_bar), "lam": float(self.lam), **extra}


__all__ = ["MR2Classifier", "ProbeClassifier"]
