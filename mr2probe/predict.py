"""Apply the probes a run selected to features: ``mr2probe predict RUN_DIR --features FILE [--split test]``.

``RUN_DIR/heads.safetensors`` (written by ``train``) holds, for every (method, seed), the parameters of the head
selected on val ("method/seed/param" → tensor) and, as metadata, the probe configuration, the input width, the
classes. Each head is rebuilt alone (:meth:`~mr2probe.heads.ProbeStack.from_state`) — the computation ``train``
used for the test predictions in predictions.npz, so predicting a run's own test split reproduces them exactly.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from .atomic import atomic_text
from .errors import UserError
from .experiment import HEADS_FORMAT, load_heads, predict_labels
from .featurestore import read_features, row_sources
from .heads import ProbeConfig, ProbeStack
from .predfile import load_predictions, save_npz
from .results import RunResults
from .trainer import pick_device


ROW_COLUMNS = ("index", "source", "label")  # the columns of predict's output that describe a row, not a head


def load_run_heads(run_dir: str | Path) -> tuple[dict, dict[str, dict[str, torch.Tensor]]]:
    """(metadata, {"method/seed": state}) of a run's saved heads; a missing or foreign file is a UserError."""
    path = Path(run_dir) / "heads.safetensors"
    if not path.is_file():
        raise UserError(f"{path} not found: heads are written by `mr2probe train` (not kept in git, and not by older "
                        "versions); train the run again")
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        flat = load_heads(path)
    except Exception as e:  # noqa: BLE001 — safetensors raises its own error types for damaged files
        raise UserError(f"{path} is not a readable heads file ({type(e).__name__}); train again") from None
    if meta.get("format") != HEADS_FORMAT:
        raise UserError(f"{path} is not a mr2probe heads file (format {meta.get('format')!r})")
    heads: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in flat.items():
        method, seed, param = key.rsplit("/", 2)
        heads.setdefault(f"{method}/{seed}", {})[param] = t
    return meta, heads


def predict_run(run_dir: str | Path, features: str | Path, split: str = "test", device: str | None = None
                ) -> pd.DataFrame:
    """Predicted class index of every selected head on ``split`` of ``features``: one row per sample (its
    ``index`` in the source dataset, its ``source`` — image path relative to the dataset root, WebDataset key or
    "dataset:split:index"; "split:index" for files without it —, ``label``), one column per "method/seed"."""
    meta, heads = load_run_heads(run_dir)
    fs = read_features(features, load=True)
    if split not in fs.splits:
        raise UserError(f"{features} has no split {split!r} (it has {', '.join(fs.splits)})")
    if fs.dim != int(meta["in_dim"]) or fs.num_classes != int(meta["num_classes"]):
        raise UserError(f"{features}: D = {fs.dim}, K = {fs.num_classes}, but the run's heads were trained on "
                        f"D = {meta['in_dim']}, K = {meta['num_classes']}")
    if json.loads(meta["class_names"]) != fs.class_names:
        raise UserError(f"{features}: its class names differ from those the run was trained on")
    sp = fs.splits[split]
    return pd.DataFrame({"index": sp.index, "source": row_sources(features, split), "label": sp.labels,
                         **apply_heads(meta, heads, sp.features, device)})


def apply_heads(meta: dict, heads: dict[str, dict[str, torch.Tensor]], features: np.ndarray,
                device: str | None = None) -> dict[str, np.ndarray]:
    """{"method/seed": predicted class index [N]} of every head of :func:`load_run_heads` on ``features`` [N, D]
    (D the run's input width), each head rebuilt alone as ``train`` scored it."""
    cfg = ProbeConfig(**json.loads(meta["probe"]))
    dev = pick_device(device)
    dim, k = int(meta["in_dim"]), int(meta["num_classes"])
    x = torch.as_tensor(features, dtype=torch.float32, device=dev)
    return {key: predict_labels(ProbeStack.from_state(cfg, dim, k, state).to(dev), x)[0].cpu().numpy()
            for key, state in heads.items()}


def methods_without_heads(run_dir: str | Path, df: pd.DataFrame) -> list[str]:
    """The run's methods (results.json) that have no column in ``df``: no head was saved for them (the exact probes
    logreg and knn are fitted by scikit-learn, not kept as heads), so ``predict`` cannot apply them."""
    path = Path(run_dir) / "results.json"
    if not path.is_file():
        return []
    methods = dict.fromkeys(r.method for r in RunResults.from_disk(path).runs)
    have = {c.rsplit("/", 1)[0] for c in df.columns if c not in ROW_COLUMNS}
    return [m for m in methods if m not in have]


def agreement_with_run(run_dir: str | Path, df: pd.DataFrame) -> pd.Series | None:
    """Per "method/seed", the fraction of test images on which ``df`` (from :func:`predict_run` on a test split)
    predicts what the run itself predicted (its predictions.npz): 1.0 for every head on the run's own features,
    and the check that re-extracted features (another CPU, another library version) reproduce the run. None when
    the run has no predictions or ``df`` holds another test set (other labels)."""
    path = Path(run_dir) / "predictions.npz"
    if not path.is_file():
        return None
    saved = load_predictions(path)
    labels = saved.pop("test_labels", None)
    if labels is None or len(labels) != len(df) or not np.array_equal(labels, df["label"].to_numpy()):
        return None
    keys = [k for k in saved if k in df.columns]
    return pd.Series({k: float((df[k].to_numpy() == saved[k]).mean()) for k in keys}) if keys else None


def write_predictions(df: pd.DataFrame, out: str | Path) -> Path:
    """``.csv`` (one column per head) or ``.npz`` ("labels", "index", "source" and one array per head, "/" in
    names stored as "__"), atomically."""
    out = Path(out)
    if out.suffix == ".csv":
        atomic_text(out, df.to_csv(index=False))
    elif out.suffix == ".npz":
        arrays = {"labels": df["label"].to_numpy(), "index": df["index"].to_numpy(),
                  **({"source": df["source"].to_numpy(str)} if "source" in df else {}),
                  **{c.replace("/", "__"): df[c].to_numpy(np.int32) for c in df.columns if c not in ROW_COLUMNS}}
        save_npz(out, arrays)
    else:
        raise UserError(f"--out {out}: use a .csv or .npz file")
    return out
