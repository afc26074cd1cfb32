"""Selection on val, one seed at a time: every method × grid point of a seed trained in one stack, the best grid
point per method chosen on val (``select``: "acc" overall or "macc" mean per-class accuracy) and evaluated once
on test; the exact probes (``logreg``, ``knn``) fitted with their grid chosen on val; the ``reach-logreg``
budget rule's calibration. Each result is a :class:`~mr2probe.results.RunRecord`.

``refit`` (off by default): once every method's grid point is chosen on val as above, its head is trained again
with those hyperparameters on train ∪ val and that head is scored on test (and saved). [choice] The refit trains
the same number of epochs E as the selected head did (E = its steps / ⌈N_train / B⌉: the floor budget, the
calibrated one under reach-logreg, its checkpoint's under the checkpoints rule), so its steps grow with the rows:
E · ⌈(N_train + N_val) / B⌉, in one cosine cycle (the checkpoints rule's warm restarts are not replayed), with the
seed's initialisation. The exact probes are fitted again at their chosen C / k. A run's ``val_score``,
``val_per_class_acc`` and grid stay those of the selection runs — the reference's val accuracy that ranks the
hard / medium / easy groups included, since val is no longer held out for a refit head — and its ``refit``
records the rows, epochs and steps the refit head trained on."""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np
import torch

from .errors import UserError
from .heads import ProbeStack
from .metrics import per_class_accuracy
from .probes import REFERENCE_PROBES, ProbeResult, fit_reference_probe, refit_reference_probe
from .progress import progress_bar
from .distributed import rank_world
from .results import RunRecord
from .runconfig import ExperimentConfig
from .settings import EXACT_PROBE, EXACT_PROBE_TOLERANCE
from .source import StreamedFeatures
from .trainer import (EpochHook, RunSpec, TrainData, TrainedStack, budget, chunk_rows, expand_runs, select_scores,
                      train_stack, train_steps)

Features = torch.Tensor | StreamedFeatures
Test = tuple[Features, torch.Tensor]  # test features and labels
Log = Callable[[str], None]


def predict_labels(probe: ProbeStack, x: Features) -> torch.Tensor:
    """argmax of every head's logits on ``x``, evaluated in chunks: [H, N]."""
    c = chunk_rows(x)
    with torch.no_grad():
        return torch.cat([probe(x[i:i + c])[1].argmax(-1) for i in range(0, len(x), c)], 1)


TOP_K = 5  # the top-k accuracy stored per run (``RunRecord.test_top5_acc``)


def predict_with_top_k(probe: ProbeStack, x: Features, y: torch.Tensor, k: int = TOP_K
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """argmax of every head's logits on ``x`` ([H, N], as :func:`predict_labels`) and every head's top-k
    accuracy ([H]): mean over images of [y_i among the min(k, K) largest logits of image i]; in chunks."""
    c, preds, hits = chunk_rows(x), [], 0
    with torch.no_grad():
        for i in range(0, len(x), c):
            logits = probe(x[i:i + c])[1]
            preds.append(logits.argmax(-1))
            hits = hits + top_k_hits(logits, y[i:i + c], k).sum(-1)
    return torch.cat(preds, 1), hits / max(len(x), 1)


def top_k_hits(logits: torch.Tensor, y: torch.Tensor, k: int = TOP_K) -> torch.Tensor:
    """[..., N] bool: y_i among the min(k, K) largest of ``logits`` [..., N, K] for image i, equal scores ranked
    by class index (the lowest first, as argmax; kNN's vote shares tie at 0 for classes without votes):

        rank_i = #{c : s_ic > s_iy} + #{c < y_i : s_ic = s_iy},     hit_i = [rank_i < k]."""
    y = y.to(logits.device)
    s_y = logits.gather(-1, y.expand(logits.shape[:-1]).unsqueeze(-1))
    lower = torch.arange(logits.shape[-1], device=logits.device) < y[:, None]  # [N, K]: c < y_i
    rank = (logits > s_y).sum(-1) + ((logits == s_y) & lower).sum(-1)
    return rank < k


def label_dtype(num_classes: int) -> type:
    """The integer type test predictions are stored in."""
    return np.int16 if num_classes < 32000 else np.int32


def scored_run(method: str, seed: int, hparams: dict[str, Any], val_score: float, select: str,
               test_pred: np.ndarray, val_pred: np.ndarray, data: TrainData, test: Test,
               grid: list[dict[str, Any]], wall_s: float, top5: float | None = None, **extra: Any) -> RunRecord:
    """The run record of a selected grid point: test accuracy, per-class accuracy on test and val (from the
    predictions), its top-5 accuracy ``top5`` when known, its grid, the stack's wall time; ``extra``: the other
    :class:`RunRecord` fields."""
    yt, yv, k = test[1].cpu().numpy(), data.val_y.cpu().numpy(), data.num_classes
    return RunRecord(method=method, seed=seed, hparams=hparams, val_score=float(val_score), select=select,
                     test_acc=float((test_pred == yt).mean()), test_top5_acc=None if top5 is None else float(top5),
                     per_class_acc=per_class_accuracy(test_pred, yt, k).tolist(),
                     val_per_class_acc=per_class_accuracy(val_pred, yv, k).tolist(), grid=grid,
                     stack_wall_time_s=round(float(wall_s), 2), **extra)


def reference_probe_run(name: str, data: TrainData, test: Test, cfg: ExperimentConfig, seed: int,
                        cache: dict[Any, Any] | None = None) -> tuple[RunRecord, np.ndarray]:
    """A exact probe (``logreg`` or ``knn``, :mod:`mr2probe.probes`) as a run of the table: its grid chosen on
    val, test scored once. It does not depend on the seed, so one fit per training set serves every seed
    (``cache``, keyed by the training rows' identity)."""
    if isinstance(data.x, StreamedFeatures):
        raise UserError(f"the exact probe {name} needs the features in memory: raise --max-memory")
    cache = {} if cache is None else cache
    key = (name, id(data.x), cfg.select)
    if key not in cache:
        cache[key] = fit_reference_probe(name, data.x, data.y, data.val_x, data.val_y, test[0], data.num_classes,
                                         cfg.select)
    res = cache[key]
    fitted, refit = res, None
    if cfg.refit:
        fitted = _refit_probe(res, data, test, cfg, cache)
        refit = {"train_rows": int(len(data.y) + len(data.val_y)), "wall_s": fitted.info.get("wall_s", 0.0),
                 **{k: fitted.info[k] for k in ("converged", "n_iter_total") if k in fitted.info}}
    top5 = None if fitted.model is None else float(top_k_hits(fitted.model.logits(test[0]), test[1]).float().mean())
    run = scored_run(name, seed, res.hparams, res.val_score, cfg.select, fitted.test_pred, res.val_pred, data, test,
                     [{"hparams": g["hparams"], "val_score": g["val_score"]} for g in res.grid],
                     res.info.get("wall_s", 0.0), top5, refit=refit,
                     reference_probe={k: v for k, v in res.info.items() if isinstance(v, (str, int, float, bool))})
    return run, fitted.test_pred.astype(label_dtype(data.num_classes))


def refit_note(n_train: int, n_val: int) -> str:
    """The note results.json keeps of a run under ``refit``."""
    return (f"refit: each method's grid point chosen on val trained again on train + val ({n_train} + {n_val} rows, "
            "the same epochs) and that head scored on test; the val scores, and the groups ranked on the reference's "
            "val accuracy, are the selection runs' (val is not held out for the refit heads)")


def refit_steps(n_train: int, n_val: int, train: Any) -> int:
    """The steps of a refit under the floor budget: its epochs E (:func:`~mr2probe.trainer.budget` on N_train)
    times ⌈(N_train + N_val) / B⌉ (another rule's refit may train other epochs: the progress bar's estimate)."""
    return budget(n_train, train)[0] * budget(n_train + n_val, train)[1]


def refit_data(data: TrainData, cache: dict[Any, Any]) -> TrainData:
    """Train ∪ val for ``refit``: the training rows, then the val rows (val stays val_x / val_y too); one copy per
    training set (``cache``). Needs the features in memory."""
    if isinstance(data.x, StreamedFeatures) or isinstance(data.val_x, StreamedFeatures):
        raise UserError("--refit trains on train + val together, which needs the features in memory: raise "
                        "--max-memory")
    key = ("refit-data", id(data.x))
    if key not in cache:
        cache[key] = TrainData(torch.cat([data.x, data.val_x]), torch.cat([data.y, data.val_y]), data.val_x,
                               data.val_y, data.num_classes)
    return cache[key]


def _refit_probe(res: ProbeResult, data: TrainData, test: Test, cfg: ExperimentConfig,
                 cache: dict[Any, Any]) -> ProbeResult:
    """The exact probe ``res`` (chosen on val) fitted again on train ∪ val; one fit per training set."""
    key = (res.name, id(data.x), cfg.select, "refit")
    if key not in cache:
        tv = refit_data(data, cache)
        cache[key] = refit_reference_probe(res, tv.x, tv.y, data.val_x, data.val_y, test[0], data.num_classes,
                                           cfg.select)
    return cache[key]


def calibrate_budget(data: TrainData, test: Test, cfg: ExperimentConfig, reference: str, seed: int, log: Log,
                     probe_cache: dict[Any, Any] | None = None) -> dict[str, Any]:
    """The ``reach-logreg`` budget rule (protocol.md: the reference must not be under-fit; a CE probe reaches the
    exact L2 logistic regression within 0.5 point): min_steps s = s₀, 2·s₀, 4·s₀, … (s₀: the floor rule's budget)
    until the reference's best val score over its grid, seed ``seed``, is within :data:`EXACT_PROBE_TOLERANCE`
    points of logreg's (C on val), or s reaches ``max_steps``. Val only: test is not looked at. The reference's
    whole grid trains every trial (a full search, also under ``search="halving"``). Returns the record kept in
    results.json's ``budget``: the chosen min_steps, whether logreg was reached, every trial."""
    exact, _ = reference_probe_run(EXACT_PROBE, data, test, replace(cfg, refit=False), seed, probe_cache)  # val only
    target = exact.val_score - EXACT_PROBE_TOLERANCE / 100
    epochs, per_epoch = budget(len(data.y), cfg.train)
    steps, trials = epochs * per_epoch, []
    while True:
        train_cfg = replace(cfg.train, min_steps=steps, search="full")
        with progress_bar(f"budget: {reference} at {steps} steps against {EXACT_PROBE} on val",
                          total=int(np.prod(budget(len(data.y), train_cfg))),
                          enabled=cfg.train.progress and rank_world()[0] == 0) as bar:
            trained = train_stack(data, expand_runs([reference], [seed], train_cfg), train_cfg, log,
                                  description=f"budget {reference}", bar=bar)
        val = float(select_scores(trained.predict(data.val_x), data.val_y, data.num_classes, cfg.select).max())
        trials.append({"min_steps": steps, "reference_val": val})
        reached = val >= target - 1e-9  # 1e-9: float noise at exactly the tolerance
        if reached or steps >= cfg.train.max_steps:
            break
        steps = min(2 * steps, cfg.train.max_steps)
    return {"rule": "reach-logreg", "min_steps": steps, "reached": bool(reached),
            "logreg_val": float(exact.val_score), "tolerance": EXACT_PROBE_TOLERANCE,
            "max_steps": cfg.train.max_steps, "seed": seed, "select": cfg.select, "trials": trials}


def _grid(trained: TrainedStack, scores: np.ndarray, heads: list[int]) -> list[dict[str, Any]]:
    """The grid points of ``heads``: hyperparameters, val score and, when there are any, the step of the kept
    checkpoint (checkpoints rule) and the step each head stopped at (successive halving)."""
    rows = [{"hparams": trained.specs[i].params, "val_score": float(scores[i])} for i in heads]
    for name, steps in (("checkpoint_step", trained.checkpoint_step), ("stopped_at", trained.stopped_at)):
        if steps is not None:
            for row, i in zip(rows, heads):
                row[name] = steps[i]
    return rows


def best_head(method: str, trained: TrainedStack, scores: np.ndarray) -> int:
    """The stack position of the method's grid point with the best val score (first on ties; under successive
    halving among the heads that reached the budget)."""
    heads = [i for i, s in enumerate(trained.specs) if s.method == method]
    reached = [i for i in heads if trained.finished[i]]
    return reached[int(np.argmax(scores[reached]))]


def score_head(state: dict[str, torch.Tensor], data: TrainData, test: Test, cfg: ExperimentConfig
               ) -> tuple[np.ndarray, float]:
    """Test predictions and top-5 accuracy of one head rebuilt alone from its parameters (the computation
    ``mr2probe predict`` makes)."""
    rebuilt = ProbeStack.from_state(cfg.train.probe, data.x.shape[1], data.num_classes, state).to(test[1].device)
    test_pred, top5 = (t[0].cpu().numpy() for t in predict_with_top_k(rebuilt, test[0], test[1]))
    return test_pred, float(top5)


@dataclass
class RefitHead:
    """A selected grid point trained again on train ∪ val: its parameters, method info and ``refit`` record."""

    state: dict[str, torch.Tensor]
    info: dict[str, Any]
    record: dict[str, Any]


def refit_heads(picks: dict[str, int], trained: TrainedStack, data: TrainData, cfg: ExperimentConfig, seed: int,
                log: Log, bar: Any = None, cache: dict[Any, Any] | None = None) -> dict[str, RefitHead]:
    """Every method's selected head (``picks``: method → stack position) trained again with its hyperparameters
    and seed on train ∪ val (:func:`refit_data`) for the epochs it trained: E = its steps / ⌈N_train / B⌉ (its
    checkpoint's under the checkpoints rule, else the stack's), i.e. E · ⌈(N_train + N_val) / B⌉ steps. Methods
    with the same E train in one stack."""
    tv = refit_data(data, {} if cache is None else cache)
    n = len(data.y)
    per_epoch = budget(n, cfg.train)[1]
    by_epochs: dict[int, list[str]] = {}
    for method, i in picks.items():
        steps = trained.checkpoint_step[i] if trained.checkpoint_step is not None else train_steps(n, cfg.train)
        by_epochs.setdefault(int(steps) // per_epoch, []).append(method)
    out: dict[str, RefitHead] = {}
    for epochs, methods in by_epochs.items():
        specs = [RunSpec(m, trained.specs[picks[m]].hparams, seed) for m in methods]
        stack = train_stack(tv, specs, cfg.train, log, epochs=epochs, description=f"refit {len(methods)} methods",
                            bar=bar, select=cfg.select)
        steps = int(np.prod(budget(len(tv.y), cfg.train, epochs)))
        for j, spec in enumerate(stack.specs):
            out[spec.method] = RefitHead(stack.probe.select([j]), dict(stack.info[j]),
                                         {"train_rows": int(len(tv.y)), "epochs": epochs, "steps": steps})
    return out


def select_method(method: str, seed: int, trained: TrainedStack, scores: np.ndarray, val_logits: torch.Tensor,
                  data: TrainData, test: Test, cfg: ExperimentConfig, wall_s: float, refit: RefitHead | None = None
                  ) -> tuple[RunRecord, np.ndarray, dict[str, torch.Tensor]]:
    """The method's grid point with the best val score (:func:`best_head`), scored on test with the head rebuilt
    alone from its parameters (:func:`score_head`) — with ``refit``, the head trained again on train ∪ val
    instead (its val score, val accuracies and grid stay the selection's): its run, test predictions and
    parameters ("method/seed/param" → tensor)."""
    heads = [i for i, s in enumerate(trained.specs) if s.method == method]
    best = best_head(method, trained, scores)
    state = trained.probe.select([best]) if refit is None else refit.state
    test_pred, top5 = score_head(state, data, test, cfg)
    ckpt = trained.checkpoint_step is not None  # the checkpoints rule: each head holds its best checkpoint
    run = scored_run(method, seed, trained.specs[best].params, scores[best], cfg.select, test_pred,
                     val_logits[best].argmax(-1).cpu().numpy(), data, test, _grid(trained, scores, heads), wall_s,
                     top5=top5,
                     checkpoint_step=trained.checkpoint_step[best] if ckpt else None,
                     checkpoint_val_scores=[float(v) for v in trained.checkpoint_scores[:, best]] if ckpt else None,
                     info=dict(trained.info[best] if refit is None else refit.info),
                     refit=None if refit is None else refit.record)
    params = {f"{method}/{seed}/{k}": v.cpu() for k, v in state.items()}
    return run, test_pred.astype(label_dtype(data.num_classes)), params


def train_seed(data: TrainData, test: Test, cfg: ExperimentConfig, seed: int, log: Log, bar: Any = None,
               probe_cache: dict[Any, Any] | None = None, on_epoch: EpochHook | None = None
               ) -> tuple[list[RunRecord], dict[str, np.ndarray], dict[str, torch.Tensor]]:
    """Train all methods × grid points of one seed in one stack (``on_epoch``: its val scores at every epoch's end,
    :data:`~mr2probe.trainer.EpochHook`); select on val; evaluate once on test
    (:func:`select_method`), under ``refit`` the selected heads trained again on train ∪ val (:func:`refit_heads`);
    the exact probes among the methods fitted alone (:func:`reference_probe_run`).
    Returns the runs, the test predictions and the saved heads' parameters ("method/seed/param" → tensor)."""
    stack_methods = [m for m in cfg.methods if m not in REFERENCE_PROBES]
    runs, preds, saved = [], {}, {}
    if cfg.refit:
        refit_data(data, {} if probe_cache is None else probe_cache)  # in memory, checked before any training
    for name in (m for m in cfg.methods if m in REFERENCE_PROBES):
        run, preds[f"{name}/{seed}"] = reference_probe_run(name, data, test, cfg, seed, probe_cache)
        runs.append(run)
    if not stack_methods:
        return runs, preds, saved
    t0 = time.time()
    trained = train_stack(data, expand_runs(stack_methods, [seed], cfg.train), cfg.train, log,
                          description=f"sweep {len(stack_methods)} methods", bar=bar, select=cfg.select,
                          on_epoch=on_epoch)
    wall = time.time() - t0
    val_logits = trained.predict(data.val_x)
    scores = select_scores(val_logits, data.val_y, data.num_classes, cfg.select)
    picks = {m: best_head(m, trained, scores) for m in stack_methods}
    refits = refit_heads(picks, trained, data, cfg, seed, log, bar, probe_cache) if cfg.refit else {}
    for method in stack_methods:
        run, preds[f"{method}/{seed}"], params = select_method(method, seed, trained, scores, val_logits, data,
                                                               test, cfg, wall, refits.get(method))
        runs.append(run)
        saved.update(params)
    return runs, preds, saved
