"""scikit-learn estimators: one probe (any method, head, adapter) trained on a feature matrix.

``ProbeClassifier`` wraps :func:`mr2probe.trainer.train_stack` with a single :class:`RunSpec`: no grid and
no validation split (hyperparameter selection is ``GridSearchCV``'s job), so it composes with ``Pipeline``,
``GridSearchCV``, ``cross_val_score`` and friends::

    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    clf = make_pipeline(StandardScaler(), mr2probe.MR2Classifier(c_bar=2.0)).fit(X, y)
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from .errors import UserError
from .heads import ProbeConfig, ProbeStack
from .trainer import TrainConfig, TrainData, expand_runs, pick_device, train_stack


class ProbeClassifier(ClassifierMixin, BaseEstimator):
    """A probe (adapter ∘ head) trained with one mr2probe method on features ``X`` [n, D], labels ``y``.

    Parameters (stored unchanged; checked at ``fit``): ``method`` (see ``mr2probe methods``), ``head``
    (linear | cosine), ``adapter`` (none | linear | mlp), ``width`` (adapter width), ``scale`` (cosine
    scale), ``epochs``, ``batch_size``, ``lr``, ``weight_decay`` (AdamW, cosine schedule), ``seed`` (init and
    data order), ``method_params`` (dict of the method's own hyperparameters, e.g. ``{"gamma": 1.0}`` for
    focal; unset ones take the method's defaults), ``device`` (torch device; default cuda if available).

    Fitted attributes: ``classes_`` (sorted labels: strings, integers, any sortable values), ``n_features_in_``,
    ``probe_`` (the trained :class:`~mr2probe.heads.ProbeStack` with one head, float64 on CPU),
    ``info_`` (the method's per-run info, e.g. MR2 margins), and for a linear head without adapter
    ``coef_`` [K, D] and ``intercept_`` [K] (softmax form: one row per class, also for K = 2).

    Methods that use a validation set (cdb) see the training set: there is no held-out split here.
    ``decision_function`` returns the logits [n, K], or ``logit₁ − logit₀`` [n] for two classes.

    scikit-learn's ``check_estimator`` (tests/test_estimator.py) passes, with these exceptions:

    * ``check_classifiers_train`` is an expected failure *with the default hyperparameters*: a toy dataset
      of a few hundred rows gets 30 AdamW steps at lr 1e-3 (one batch per epoch) and stays near its random
      init, below the check's 83% training accuracy. With ``lr=0.1`` it passes (as do all other checks, for
      ProbeClassifier and MR2Classifier, linear and cosine heads).
    * ``check_sample_weight*`` and ``check_classifiers_one_label_sample_weights`` are not generated: ``fit``
      takes no ``sample_weight`` (the methods reweight samples themselves).
    * sklearn itself skips ``check_array_api_input`` unless ``SCIPY_ARRAY_API=1`` is set, and
      ``check_classifier_data_not_an_array`` when pandas is not installed.

    Training data with a single class raises ``ValueError`` (as sklearn's checks allow).
    """

    def __init__(self, method: str = "ce", head: str = "linear", adapter: str = "none", width: int = 256,
                 scale: float = 16.0, epochs: int = 30, batch_size: int = 512, lr: float = 1e-3,
                 weight_decay: float = 1e-4, seed: int = 0, method_params: dict[str, Any] | None = None,
                 device: str | None = None) -> None:
        self.method = method
        self.head = head
        self.adapter = adapter
        self.width = width
        self.scale = scale
        self.epochs = epochs
        self.batch_size = batch_size
        self.lr = lr
        self.weight_decay = weight_decay
        self.seed = seed
        self.method_params = method_params
        self.device = device

    def _method_params(self) -> dict[str, Any]:
        return dict(self.method_params or {})

    def _train_config(self) -> TrainConfig:
        probe = ProbeConfig(head=self.head, adapter=self.adapter, width=int(self.width), scale=float(self.scale))
        return TrainConfig(epochs=int(self.epochs), batch_size=int(self.batch_size), lrs=(float(self.lr),),
                           weight_decays=(float(self.weight_decay),),
                           method_params={self.method: self._method_params()}, use_method_grids=False,
                           probe=probe, device=self.device, progress=False)

    def fit(self, X: Any, y: Any) -> "ProbeClassifier":
        """Train one probe on all of ``X``, ``y``; returns self."""
        X, y = validate_data(self, X, y, dtype=[np.float64, np.float32])
        check_classification_targets(y)
        self.classes_, y_enc = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(f"{type(self).__name__} needs samples of at least 2 classes; got 1 class")
        try:
            cfg = self._train_config()
            cfg.check()
            device = pick_device(cfg.device)
            x = torch.tensor(X, dtype=torch.float32, device=device)
            yt = torch.as_tensor(y_enc.astype(np.int64), device=device)
            data = TrainData(x, yt, x, yt, len(self.classes_))
            specs = expand_runs([self.method], [int(self.seed)], cfg)
            trained = train_stack(data, specs, cfg)
        except UserError as e:  # bad hyperparameter or diverged training: sklearn expects ValueError
            raise ValueError(str(e)) from None
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

    def __init__(self, method: str = "mr2", p: float = 3.0, c_bar: float = 1.0, lam: float = 0.1,
                 head: str = "linear", adapter: str = "none", width: int = 256, scale: float = 16.0,
                 epochs: int = 30, batch_size: int = 512, lr: float = 1e-3, weight_decay: float = 1e-4,
                 seed: int = 0, method_params: dict[str, Any] | None = None, device: str | None = None) -> None:
        super().__init__(method=method, head=head, adapter=adapter, width=width, scale=scale, epochs=epochs,
                         batch_size=batch_size, lr=lr, weight_decay=weight_decay, seed=seed,
                         method_params=method_params, device=device)
        self.p = p
        self.c_bar = c_bar
        self.lam = lam

    def _method_params(self) -> dict[str, Any]:
        extra = dict(self.method_params or {})
        twice = sorted({"p", "c_bar", "lam"} & set(extra))
        if twice:
            raise ValueError(f"set {', '.join(twice)} as MR2Classifier parameters, not in method_params")
        return {"p": float(self.p), "c_bar": float(self.c_bar), "lam": float(self.lam), **extra}


__all__ = ["MR2Classifier", "ProbeClassifier"]
