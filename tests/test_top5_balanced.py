"""Top-5 accuracy (stored per run at training time) and balanced accuracy (mean per-class recall) as columns of the
tables' model: checked against scikit-learn on a trained run, absent or NaN for results made before Top5 was stored,
shown by --wide and the CSVs, not by the compact terminal table."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import balanced_accuracy_score, top_k_accuracy_score

from conftest import run_cli, write_by_hand
from mr2probe.featurestore import read_features
from mr2probe.heads import ProbeConfig, ProbeStack
from mr2probe.predfile import load_predictions
from mr2probe.predict import load_run_heads
from mr2probe.probes import KNNModel
from mr2probe.report import load_results, summarize, terminal_table
from mr2probe.selection import predict_with_top_k, top_k_hits
from test_report import write_results

K = 12  # more classes than 5, so that top-5 accuracy is below 100 %


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("top5")
    feats = write_by_hand(tmp / "f.h5", k=K, d=6, n_train=240, n_test=240, seed=3)
    out = tmp / "run"
    r = run_cli("train", "--features", str(feats), "--out", str(out), "-q", "--methods", "ce,logreg,knn",
                "--seeds", "2", "--epochs", "1", "--min-steps", "10")
    assert r.returncode == 0, r.stderr
    return feats, out


def test_top5_and_balanced_accuracy_match_sklearn(run: tuple[Path, Path]) -> None:
    feats, out = run
    meta, heads = load_run_heads(out)
    fs = read_features(feats, load=True)
    x, y = (torch.as_tensor(fs.splits["test"].features, dtype=torch.float32),
            np.asarray(fs.splits["test"].labels))
    cfg = ProbeConfig(**json.loads(meta["probe"]))
    runs = {r.key: r for r in load_results(out).runs}
    saved = load_predictions(out / "predictions.npz")
    tops, bals = [], []
    assert set(heads) >= {"ce/0", "ce/1"}
    for key, state in heads.items():
        probe = ProbeStack.from_state(cfg, fs.dim, fs.num_classes, state)
        with torch.no_grad():
            logits = probe(x)[1][0].numpy()
        top5 = top_k_accuracy_score(y, logits, k=5, labels=np.arange(K))
        assert runs[key].test_top5_acc == pytest.approx(top5)
        assert runs[key].test_top5_acc > runs[key].test_acc  # a real top-5: more than the top-1 hits
        bal = balanced_accuracy_score(y, saved[key])
        if key.startswith("ce/"):
            tops.append(100 * top5)
            bals.append(100 * bal)
    assert 0 < min(tops) and max(tops) < 100
    s = summarize(load_results(out), saved)
    assert s.mean["ce"]["Top5"] == pytest.approx(np.mean(tops))
    assert s.mean["ce"]["BalancedAcc"] == pytest.approx(np.mean(bals))
    table = pd.read_csv(out / "table.csv").set_index("method")
    assert table.loc["ce", "top5"] == pytest.approx(np.mean(tops), abs=1e-4)
    assert table.loc["ce", "balanced_acc"] == pytest.approx(np.mean(bals), abs=1e-4)
    assert "top5_sd" in table.columns and "balanced_acc_sd" in table.columns


def test_exact_probes_logreg_and_knn_have_top5(run: tuple[Path, Path]) -> None:
    """knn's top-5 ranks its vote shares (ties to the lowest class): recomputed here from the probe's model."""
    feats, out = run
    runs = {r.key: r for r in load_results(out).runs}
    fs = read_features(feats, load=True)
    tensor = {s: torch.as_tensor(fs.splits[s].features, dtype=torch.float32) for s in ("train", "test")}
    y_test = torch.as_tensor(fs.splits["test"].labels)
    rows = torch.as_tensor(runs_train_rows(fs))
    model = KNNModel(tensor["train"][rows], torch.as_tensor(fs.splits["train"].labels)[rows], K,
                     runs["knn/0"].hparams["k"])
    top5 = float(top_k_hits(model.logits(tensor["test"]), y_test).float().mean())
    assert runs["knn/0"].test_top5_acc == pytest.approx(top5)
    for name in ("logreg", "knn"):
        assert runs[f"{name}/0"].test_acc <= runs[f"{name}/0"].test_top5_acc <= 1
    s = summarize(load_results(out), load_predictions(out / "predictions.npz"))
    assert s.mean["logreg"]["Top5"] == pytest.approx(100 * runs["logreg/0"].test_top5_acc)
    assert s.mean["knn"]["Top5"] == pytest.approx(100 * runs["knn/0"].test_top5_acc)


def runs_train_rows(fs) -> np.ndarray:
    """The training rows of a run without a val split in its file: train less the stratified 10 % hold-out."""
    from mr2probe.orchestrate import holdout_val

    return holdout_val(fs.splits["train"].labels, 0.1, 0)[0]


def test_compact_table_leaves_them_out_wide_shows_them(run: tuple[Path, Path]) -> None:
    _, out = run
    s = summarize(load_results(out), load_predictions(out / "predictions.npz"))
    compact, wide = terminal_table(s), terminal_table(s, wide=True)
    assert "Top5" not in compact and "BalancedAcc" not in compact
    header = next(line for line in wide.splitlines() if line.lstrip().startswith("method"))
    assert "Top5" in header and "BalancedAcc" in header


def test_predict_with_top_k_counts_hits_per_head() -> None:
    logits = torch.tensor([[[5.0, 4, 3, 2, 1, 0], [0, 1, 2, 3, 4, 5]]])  # one head, two images, K = 6
    probe = lambda x: (None, logits[:, : len(x)])  # noqa: E731 — a stand-in for ProbeStack's (features, logits)
    pred, top = predict_with_top_k(probe, torch.zeros(2, 1), torch.tensor([5, 5]), k=5)
    assert pred.tolist() == [[0, 5]] and top.tolist() == [0.5]  # class 5 is 6th for image 0, 1st for image 1


def test_results_without_top5_read_with_the_column_absent(tmp_path: Path) -> None:
    s = summarize(load_results(write_results(tmp_path / "old")))  # per_class_acc only, as before Top5 was stored
    frame = s.frame()
    assert "Top5" not in frame.columns and "Top5" not in s.extra_columns()
    assert frame.loc["ce", "BalancedAcc"] == pytest.approx(100 * np.mean([0.9, 0.25, 0.5, 0.8, 0.4, 1.0, 0.6]))
    record = load_results(tmp_path / "old").runs[0]
    assert record.test_top5_acc is None and "test_top5_acc" not in record.to_dict()
