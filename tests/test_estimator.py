"""The scikit-learn estimators: sklearn's own estimator checks, Pipeline + GridSearchCV on real features."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegressionCV
from sklearn.model_selection import GridSearchCV, StratifiedKFold, cross_val_score
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import check_estimator

import mr2probe
from mr2probe.featurestore import read_features

from conftest import BUNDLED

@pytest.mark.parametrize("estimator", [
    mr2probe.ProbeClassifier(),
    mr2probe.MR2Classifier(),
    mr2probe.MR2Classifier(head="cosine"),
], ids=["probe-defaults", "mr2-defaults", "mr2-cosine-defaults"])
@pytest.mark.slow
def test_sklearn_check_estimator_with_defaults(estimator) -> None:
    """Every generated check passes with the default hyperparameters, check_classifiers_train included (the
    defaults converge: ≥ 1000 AdamW steps, weight decay chosen on an internal hold-out)."""
    results = check_estimator(estimator, on_skip=None)
    assert [r["check_name"] for r in results if r["status"] in ("failed", "xfail")] == []
    assert "check_classifiers_train" in {r["check_name"] for r in results if r["status"] == "passed"}


def test_defaults_match_logistic_regression_on_a_small_real_dataset() -> None:
    """scikit-learn's digits (1,797 real 8×8 handwritten digits), 3-fold CV in a Pipeline: the CE probe with its
    defaults is within 0.5 pt of LogisticRegression with C chosen on val (LogisticRegressionCV)."""
    X, y = load_digits(return_X_y=True)
    folds = StratifiedKFold(3, shuffle=True, random_state=0)
    logreg = make_pipeline(StandardScaler(), LogisticRegressionCV(Cs=np.logspace(-3, 3, 13).tolist(), max_iter=5000,
                                                                  scoring="accuracy", l1_ratios=(0.0,),
                                                                  use_legacy_attributes=False))
    ref = cross_val_score(logreg, X, y, cv=folds).mean()
    ours = cross_val_score(make_pipeline(StandardScaler(), mr2probe.ProbeClassifier()), X, y, cv=folds).mean()
    assert ours >= ref - 0.005, (ours, ref)


def test_best_params_are_chosen_on_a_hold_out() -> None:
    x, y = load_digits(return_X_y=True)
    clf = mr2probe.ProbeClassifier(lr=1e-2, l2=[1e-4, 1e-1]).fit(x[:400], y[:400])
    assert clf.best_params_["lr"] == 1e-2 and clf.best_params_["l2"] in (1e-4, 1e-1)
    assert clf.best_params_["wd"] == 0.0
    fixed = mr2probe.ProbeClassifier(lr=0.05, wd=0.0, l2=1e-3).fit(x[:400], y[:400])
    assert fixed.best_params_ == {"lr": 0.05, "wd": 0.0, "l2": 1e-3}
    with pytest.raises(ValueError, match="val_fraction"):
        mr2probe.ProbeClassifier(val_fraction=1.5).fit(x[:400], y[:400])


@pytest.fixture(scope="module")
def fmnist() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """600 train / 1000 test rows of the bundled Fashion-MNIST × EfficientNet-Lite0 features, string labels."""
    fs = read_features(BUNDLED)
    names = np.array(fs.class_names)
    tr, te = fs.splits["train"], fs.splits["test"]
    return (tr.features[:600].astype(np.float32), names[tr.labels[:600]],
            te.features[:1000].astype(np.float32), names[te.labels[:1000]])


@pytest.mark.slow
def test_pipeline_grid_search_on_real_features(fmnist) -> None:
    x, y, xt, yt = fmnist
    pipe = Pipeline([("scale", StandardScaler()), ("probe", mr2probe.MR2Classifier(epochs=10, batch_size=128,
                                                                                   lr=1e-2))])
    gs = GridSearchCV(pipe, {"probe__c_bar": [1.0, 2.0]}, cv=3, error_score="raise").fit(x, y)
    assert gs.best_params_["probe__c_bar"] in (1.0, 2.0)
    assert gs.score(xt, yt) > 0.7
    proba = gs.predict_proba(xt)
    assert proba.shape == (len(xt), 10)
    np.testing.assert_allclose(proba.sum(1), 1.0, atol=1e-9)
    assert set(gs.predict(xt)) <= set(y) and list(gs.classes_) == sorted(set(y))
    margins = gs.best_estimator_[-1].info_
    assert margins, "MR2's per-run info (margins) is kept on the fitted estimator"


def test_probe_classifier_ldam_and_linear_coef(fmnist) -> None:
    x, y, xt, yt = fmnist
    clf = mr2probe.ProbeClassifier(method="ldam", epochs=10, batch_size=128, lr=1e-2).fit(x, y)
    assert clf.score(xt, yt) > 0.7
    assert clf.coef_.shape == (10, x.shape[1]) and clf.intercept_.shape == (10,)
    np.testing.assert_allclose(xt @ clf.coef_.T + clf.intercept_, clf.decision_function(xt), rtol=1e-4, atol=1e-4)
    again = pickle.loads(pickle.dumps(clf))
    np.testing.assert_array_equal(again.predict(xt), clf.predict(xt))


def test_parameters_are_stored_unchanged_and_checked_at_fit() -> None:
    params = {"mu": 1.0}
    clf = mr2probe.ProbeClassifier(method="nope", method_params=params)
    assert clf.get_params()["method_params"] is params and clone(clf).method == "nope"
    x, y = np.random.default_rng(0).normal(size=(20, 3)), np.arange(20) % 2
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        clf.fit(x, y)
    with pytest.raises(ValueError, match="no hyperparameter mu"):
        mr2probe.ProbeClassifier(method_params=params).fit(x, y)
    with pytest.raises(ValueError, match="not in method_params"):
        mr2probe.MR2Classifier(method_params={"p": 2.0}).fit(x, y)
    assert mr2probe.MR2Classifier(p=2.0, method_params={"stats": "exact"}).fit(x, y).decision_function(x).shape == (20,)
