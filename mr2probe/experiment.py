"""The train stage: feature file → runs of every (method, seed) with the grid selected on val → results.json.

Protocol (../shared/spec/protocol.md): val is the file's val split, else a stratified hold-out of train
(``val_fraction``, fixed ``val_seed``, the same for every run). For each (method, seed) the grid point with
the best val score (``select``: "acc" overall or "macc" mean per-class accuracy) is kept and evaluated once on
test. Each seed's stack is saved to ``RUN_DIR/parts/`` as soon as it finishes, so a killed run resumes
without retraining finished seeds. Under the ``checkpoints`` budget rule each head is in its best checkpoint's
state (trainer.py), so the selection picks (checkpoint step, lr, wd, method parameters) per method. Under
``search="halving"`` (successive halving, trainer.py) each method's grid is cut on val at the rungs and the
selection is among the heads that reached the budget; every grid entry records the step its head stopped at.

Features (train + val + test as float32) that fit in ``max_memory`` are loaded onto the training device;
larger files are validated chunk by chunk and streamed from the file during training (``source.py``).
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import h5py
import numpy as np
import torch
from safetensors.torch import load_file, save_file

from . import __version__
from .atomic import atomic_write
from .errors import UserError
from .distributed import barrier, rank_world
from .jsonfile import atomic_json, grid_columns, grid_rows
from .featurestore import FeatureSet, check_classes_covered, content_sha256, file_sha256, read_features
from .heads import ProbeConfig, ProbeStack
from .methods import METHODS
from .metrics import null_name, per_class_accuracy
from .predfile import LABELS, load_predictions, save_predictions
from .probes import REFERENCE_PROBES, SELECT, fit_reference_probe
from .profiles import Profile, draw_seed, parse_profile, select_rows
from .settings import BUDGET_RULES, EXACT_PROBE, EXACT_PROBE_TOLERANCE, resolved
from .progress import console, progress_bar
from .source import DEFAULT_MAX_MEMORY, StreamedFeatures, parse_size, resolve_max_memory, stream_layout
from .trainer import (TrainConfig, TrainData, budget, checkpoint_steps, chunk_rows, expand_runs, method_hparams,
                      pick_device, search_schedule, select_scores, train_stack, train_steps)

SELECT_METRICS = SELECT  # val score of the grid: overall or mean per-class accuracy (as the exact probes)


@dataclass
class ExperimentConfig:
    """Everything ``mr2probe train`` takes besides the probe/trainer settings."""

    features: Path
    out: Path
    methods: list[str] = field(default_factory=lambda: ["ce", "mr2"])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    select: str = "acc"
    val_fraction: float = 0.1
    val_seed: int = 0
    reference: str = "ce"
    null: bool = True  # also train the reference on disjoint seeds (the null control, see `null_seeds`)
    profile: Profile = field(default_factory=Profile)  # training-set profile (train only; val and test untouched)
    train: TrainConfig = field(default_factory=TrainConfig)
    max_memory: int | str = DEFAULT_MAX_MEMORY  # feature memory cap: bytes, "512MB", "8GiB", … or "auto" (source.py)

    @property
    def reference_method(self) -> str:
        """The method that defines the groups: ``reference`` when it is among the methods, else the first method."""
        return self.reference if self.reference in self.methods else self.methods[0]

    def check(self) -> None:
        self.train.check()
        for m in self.methods:
            if m in REFERENCE_PROBES:
                if m in self.train.method_params:
                    raise UserError(f"--set {m}.…: the exact probes take no --set (their grid is chosen on val)")
                continue
            if METHODS.get(m).needs_adapter and self.train.probe.adapter == "none":
                raise UserError(f"method {m!r} needs a trainable adapter: pass --adapter linear or mlp")
            method_hparams(m, self.train)  # unknown or invalid --set values: refused before anything is written
        if not self.methods:
            raise UserError("--methods is empty; give comma-separated names (see `mr2probe methods`) or 'all'")
        stray = sorted(set(self.train.method_params) - set(self.methods))
        if stray:  # a typo'd or forgotten method would otherwise make the --set silently do nothing
            raise UserError(f"--set names {', '.join(stray)}, which is not in --methods ({', '.join(self.methods)})")
        if not self.seeds:
            raise UserError("--seeds must be ≥ 1")
        reference = self.reference_method
        if self.train.budget_rule == "reach-logreg" and reference in REFERENCE_PROBES:
            raise UserError(f"--budget-rule reach-logreg calibrates the reference's steps; the reference {reference} "
                            "is not trained in steps (pass --reference ce)")
        if self.select not in SELECT_METRICS:
            raise UserError(f"--select must be one of {', '.join(SELECT_METRICS)}, got {self.select!r}")
        if not 0 < self.val_fraction < 1:
            raise UserError(f"--val-fraction must be in (0, 1), got {self.val_fraction}")
        parse_size(self.max_memory)


def config_from_settings(features: Path, out: Path, methods: list[str], seeds: list[int], head: str = "linear",
                         adapter: str = "none", values: dict[str, Any] | None = None,
                         method_params: dict[str, dict[str, Any]] | None = None, profile: str = "full",
                         progress: bool = True) -> ExperimentConfig:
    """The ``ExperimentConfig`` of ``mr2probe train`` and of one suite cell, from :data:`~mr2probe.settings.TRAIN`
    values (name → value; missing ones take their defaults; grids as tuples). ``groups_on`` is the report's and
    is not part of it."""
    v = resolved(values or {})
    probe = ProbeConfig(head=head, adapter=adapter, width=v["width"], scale=v["scale"][0] if v["scale"] else 16.0,
                        learn_scale=v["learn_scale"])
    train = TrainConfig(epochs=v["epochs"], batch_size=v["batch_size"], lrs=tuple(v["lr"]),
                        weight_decays=tuple(v["wd"]), l2s=tuple(v["l2"]),
                        min_steps=v["min_steps"], budget_rule=v["budget_rule"], max_steps=v["max_steps"],
                        search=v["search"],
                        scales=tuple(v["scale"]),
                        method_params={m: dict(p) for m, p in (method_params or {}).items()},
                        use_method_grids=v["method_grid"], probe=probe, device=v["device"], progress=progress,
                        compile=v["compile"], cuda_graph=v["cuda_graph"], tf32=v["tf32"])
    return ExperimentConfig(features=Path(features), out=Path(out), methods=list(methods), seeds=list(seeds),
                            select=v["select"], val_fraction=v["val_fraction"], reference=v["reference"],
                            null=v["null"], train=train, max_memory=parse_size(v["max_memory"]),
                            profile=parse_profile(profile, v["episodes"], v["profile_seed"]))


def replicates(cfg: ExperimentConfig) -> list[tuple[int, int]]:
    """(seed, episode) of every stack: each seed once per episode of the training profile. With E > 1 episodes the
    seeds of episode e are shifted by e·(max seed + 1), so every stack has its own seed (init and data order) and
    the table averages over all E × S of them like seeds."""
    stride = max(cfg.seeds) + 1
    return [(s + e * stride, e) for e in range(cfg.profile.episodes) for s in cfg.seeds]


def take_rows(x: torch.Tensor | StreamedFeatures, rows: np.ndarray) -> torch.Tensor | StreamedFeatures:
    """The rows ``rows`` (sorted positions) of a feature matrix, in memory or streamed from the file."""
    if isinstance(x, StreamedFeatures):
        base = np.arange(x.ds.shape[0]) if x.rows is None else x.rows
        return StreamedFeatures(x.ds, base[rows], x.device, x.block_rows, x.piece_rows, x.dtype)
    return x[torch.as_tensor(rows, device=x.device)]


def null_seeds(seeds: list[int]) -> list[int]:
    """The null control's seeds: as many as ``seeds``, disjoint from them (max + 1, max + 2, …; 0..N−1 → N..2N−1)."""
    return list(range(max(seeds) + 1, max(seeds) + 1 + len(seeds)))


def holdout_val(y: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Stratified split of positions into (train, val): ⌈fraction·n_k⌉ of each class (≥ 1 kept for train)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    order = order[np.argsort(y[order], kind="stable")]  # grouped by class, random within class
    cls = y[order]
    first = np.searchsorted(cls, cls, side="left")
    counts = np.bincount(y)
    rank = np.arange(len(y)) - first
    # ⌈f·n⌉ up to rounding error in f·n (0.07 · 100 = 7.000000000000001 must give 7, not 8)
    n_val = np.minimum(np.ceil(fraction * counts - 1e-9).astype(int), np.maximum(counts - 1, 0))
    is_val = rank < n_val[cls]
    return np.sort(order[~is_val]), np.sort(order[is_val])


def prepare_data(fs: FeatureSet, cfg: ExperimentConfig, device: torch.device, h5: h5py.File | None = None,
                 max_memory: int = 0) -> tuple[TrainData, tuple[torch.Tensor | StreamedFeatures, torch.Tensor],
                                               dict[str, Any]]:
    """Data for training, validation and test, and a description of where val came from.

    Labels are tensors on ``device``. Features: tensors on ``device`` from ``fs`` (read with its features); or,
    given ``h5`` (the open feature file; ``fs`` read with ``load="labels"``), :class:`StreamedFeatures` of it,
    with training blocks sized by ``max_memory`` (``stream_layout``)."""
    def t(a: np.ndarray, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.as_tensor(a, dtype=dtype, device=device)

    if h5 is None:
        def features(split: str, rows: np.ndarray | None) -> torch.Tensor:
            x = fs.splits[split].features
            return t(x if rows is None else x[rows])
    else:
        chunks = h5["train"]["features"].chunks
        block, piece = stream_layout(max_memory, fs.dim, cfg.train.batch_size, chunks[0] if chunks else None)

        def features(split: str, rows: np.ndarray | None) -> StreamedFeatures:
            return StreamedFeatures(h5[split]["features"], rows, device, block, piece)

    tr = fs.splits["train"]
    if "val" in fs.splits:
        x, y = features("train", None), tr.labels
        vx, vy = features("val", None), fs.splits["val"].labels
        source = "file"
    else:
        keep, held = holdout_val(tr.labels, cfg.val_fraction, cfg.val_seed)
        x, y, vx, vy = features("train", keep), tr.labels[keep], features("train", held), tr.labels[held]
        source = f"stratified {cfg.val_fraction:.0%} of train (seed {cfg.val_seed})"
    te = fs.splits["test"]
    data = TrainData(x, t(y, torch.long), vx, t(vy, torch.long), fs.num_classes)
    sizes = {"train": int(len(y)), "val": int(len(vy)), "test": int(len(te.labels)), "val_source": source}
    return data, (features("test", None), t(te.labels, torch.long)), sizes


HEADS_FORMAT = "mr2probe.heads/1"


def predict_labels(probe: ProbeStack, x: torch.Tensor | StreamedFeatures) -> torch.Tensor:
    """argmax of every head's logits on ``x``, evaluated in chunks: [H, N]."""
    c = chunk_rows(x)
    with torch.no_grad():
        return torch.cat([probe(x[i:i + c])[1].argmax(-1) for i in range(0, len(x), c)], 1)


def load_heads(path: Path) -> dict[str, torch.Tensor]:
    """A heads file written by :func:`run_experiment` (safetensors: tensors only, no pickled code)."""
    try:
        return load_file(str(path))
    except Exception as e:  # noqa: BLE001 — safetensors raises its own error types for a damaged file
        raise UserError(f"{path} is not a readable heads file ({type(e).__name__}); delete it and train again") \
            from None


def save_heads(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """Write a heads file atomically; a failed write is one UserError and leaves nothing behind."""
    def write(p: Path) -> None:
        try:
            save_file(tensors, str(p), metadata=metadata)
        except Exception as e:  # noqa: BLE001 — SafetensorError is not an OSError
            raise OSError(str(e)) from None

    atomic_write(path, write)


LINEAR_KEY_SCALES = (8.0, 16.0, 32.0, 64.0)  # the value of ``scales`` in every linear-head part key


ENGINE_SETTINGS = ("compile", "cuda_graph", "tf32")  # how a GPU runs the step: the same heads within float rounding


def _keyed_train(train: dict[str, Any]) -> dict[str, Any]:
    """The training settings that change the numbers: without the progress bars and CPU chunking, without the
    budget rule's settings under the default rule ``floor`` and without ``search`` under the default ``full`` (so
    keys made before the rule or the search existed are unchanged)."""
    drop = {"progress", "chunk_mib", *ENGINE_SETTINGS}
    drop |= {"budget_rule", "max_steps"} if train.get("budget_rule", "floor") == "floor" else set()
    drop |= {"search"} if train.get("search", "full") == "full" else set()
    return {k: v for k, v in train.items() if k not in drop}


def _config_key(cfg: ExperimentConfig, features_hash: str, stream: dict[str, int] | None = None) -> str:
    """Identifies a seed's part file: everything that changes the numbers, not how the run is shown (progress
    bars), so `train -q` and `bench` share parts; ``stream`` (block and piece rows, which fix the streamed data
    order) only when the features are streamed, so in-memory keys are unchanged. Left out besides the progress
    bars: ``chunk_mib``, how the CPU groups the heads (the same heads, equal within float rounding)."""
    train = _keyed_train(asdict(cfg.train))
    if cfg.train.probe.head != "cosine":
        # the cosine scale (grid, start value, learnable) does not touch a linear head: its key holds fixed values,
        # those of the default before the grid was widened to 256, so that parts finished then are still found
        train["scales"] = LINEAR_KEY_SCALES
        train["probe"] = {**train["probe"], "scale": LINEAR_KEY_SCALES[0], "learn_scale": False}
    key = {"features": features_hash, "methods": cfg.methods, "train": train, "select": cfg.select,
           "val": [cfg.val_fraction, cfg.val_seed]}
    if cfg.profile.kind != "full":  # only then, so keys of full-set runs are unchanged
        key["profile"] = cfg.profile.as_dict()
    if stream:
        key["stream"] = stream
    blob = json.dumps(key, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


FINISHED_BEFORE = ("this run is finished: the folder's results.json was made by the same settings from features of the "
                   "same content (its parts/ are gone, e.g. in a fresh clone): kept as it is, nothing trained")
# results.json fields that describe how a run was made or shown, not its numbers
_AS_MADE = ("provenance", "notes", "config", "mr2probe_version")


def _config_record(cfg: ExperimentConfig) -> dict[str, Any]:
    """results.json's ``config``: the run's settings as given (``search`` only when it is not the default ``full``,
    so that results.json of a full search is as before the setting existed)."""
    train = asdict(cfg.train)
    if train["search"] == "full":
        del train["search"]
    return {"methods": cfg.methods, "seeds": cfg.seeds, "null": cfg.null, "select": cfg.select,
            "val_fraction": cfg.val_fraction, "val_seed": cfg.val_seed, "train": train,
            "max_memory": cfg.max_memory}


def _run_identity(config: dict[str, Any], profile: dict[str, Any], reference: str, content_hash: str | None,
                  stream: dict[str, Any] | None) -> str:
    """What fixes a run's numbers, as a string: every setting its part keys hold (the training settings without
    progress bars and chunking, and without the cosine scale on a linear head), the seeds, the null control and
    its reference, the profile, the features' content and the streamed order. Built alike from a results.json
    and from the command being run."""
    config = json.loads(json.dumps(config, default=str))  # tuples as lists, as results.json holds them
    train = _keyed_train(config["train"])
    if train["probe"]["head"] != "cosine":
        train = {**train, "scales": None, "probe": {**train["probe"], "scale": None, "learn_scale": None}}
    ident = {"train": train, "reference": reference, "features": content_hash, "stream": stream,
             "profile": {k: v for k, v in profile.items() if k != "describe"},
             **{k: config[k] for k in ("methods", "seeds", "null", "select", "val_fraction", "val_seed")}}
    return json.dumps(ident, sort_keys=True, default=str)


def _finished(out: Path, identity: str, results: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The folder's results.json when it was made by a run of the same identity (``_run_identity``) and its
    predictions are there: the run is finished even when its parts/ and heads are gone (neither is kept in git,
    so a fresh clone of a committed run has none), and it is kept as it is instead of trained again. With
    ``results`` (every seed stack was found in parts/), only when it also holds those numbers (fields of
    ``_AS_MADE`` aside): re-running a finished command rewrites nothing, so the first run's provenance is kept."""
    try:
        old = json.loads((out / "results.json").read_text())
        prov = old["provenance"]
        stream = ({"block_rows": prov["stream_block_rows"], "piece_rows": prov["stream_piece_rows"]}
                  if prov.get("stream_block_rows") is not None else None)
        made_by = _run_identity(old["config"], old["profile"], old["reference"], prov.get("features_content_sha256"),
                                stream)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    files = (out / "predictions.npz").exists()
    def numbers(r: dict[str, Any]) -> dict[str, Any]:  # grids in one layout: a file may hold them as rows
        r = json.loads(json.dumps(r, default=str))
        r["runs"] = [{**run, "grid": grid_columns(grid_rows(run.get("grid")))} for run in r.get("runs", [])]
        return {k: v for k, v in r.items() if k not in _AS_MADE}

    same = results is None or numbers(old) == numbers(results)
    return old if made_by == identity and files and same else None


def cpu_name() -> str:
    """The CPU model (Linux: /proc/cpuinfo; ``platform.processor()`` is often empty there)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _adopt_legacy_parts(parts: dict[int, tuple[Path, Path]], folder: Path, legacy_key: str, log) -> None:
    """Seeds finished by earlier versions, whose parts were keyed by the feature file's sha256 (which changes
    with its timestamp), are renamed to the content-based key instead of being trained again."""
    for seed, (pj, pn) in parts.items():
        old_j, old_n = folder / f"seed{seed}-{legacy_key}.json", folder / f"seed{seed}-{legacy_key}.npz"
        if not (pj.exists() and pn.exists()) and old_j.exists() and old_n.exists():
            os.replace(old_n, pn)
            os.replace(old_j, pj)
            log(f"seed {seed}: part keyed by the file hash (older mr2probe) renamed to {pj.name}")


def reference_probe_run(name: str, data: TrainData, test: tuple[torch.Tensor | StreamedFeatures, torch.Tensor],
                        cfg: ExperimentConfig, seed: int, cache: dict[Any, Any] | None = None
                        ) -> tuple[dict[str, Any], np.ndarray]:
    """A exact probe (``logreg`` or ``knn``, :mod:`mr2probe.probes`) as a run of the table: its grid chosen on
    val, test scored once. It does not depend on the seed, so one fit per training set serves every seed
    (``cache``, keyed by the training rows' identity)."""
    if isinstance(data.x, StreamedFeatures):
        raise UserError(f"the exact probe {name} needs the features in memory: raise --max-memory")
    key = (name, id(data.x), cfg.select)
    if cache is None or key not in cache:
        res = fit_reference_probe(name, data.x, data.y, data.val_x, data.val_y, test[0], data.num_classes, cfg.select)
        if cache is not None:
            cache[key] = res
    res = cache[key] if cache is not None else res
    yt, yv = test[1].cpu().numpy(), data.val_y.cpu().numpy()
    run = {"method": name, "seed": seed, "hparams": res.hparams, "val_score": float(res.val_score),
           "select": cfg.select, "test_acc": float((res.test_pred == yt).mean()),
           "per_class_acc": per_class_accuracy(res.test_pred, yt, data.num_classes).tolist(),
           "val_per_class_acc": per_class_accuracy(res.val_pred, yv, data.num_classes).tolist(),
           "grid": grid_columns([{"hparams": g["hparams"], "val_score": g["val_score"]} for g in res.grid]),
           "stack_wall_time_s": round(float(res.info.get("wall_s", 0.0)), 2),
           "reference_probe": {k: v for k, v in res.info.items() if isinstance(v, (str, int, float, bool))}}
    return run, res.test_pred.astype(np.int16 if data.num_classes < 32000 else np.int32)


def calibrate_budget(data: TrainData, test: tuple[torch.Tensor | StreamedFeatures, torch.Tensor],
                     cfg: ExperimentConfig, reference: str, seed: int, log, probe_cache: dict[Any, Any] | None = None
                     ) -> dict[str, Any]:
    """The ``reach-logreg`` budget rule (protocol.md: the reference must not be under-fit; a CE probe reaches the
    exact L2 logistic regression within 0.5 point): min_steps s = s₀, 2·s₀, 4·s₀, … (s₀: the floor rule's budget)
    until the reference's best val score over its grid, seed ``seed``, is within :data:`EXACT_PROBE_TOLERANCE`
    points of logreg's (C on val), or s reaches ``max_steps``. Val only: test is not looked at. The reference's
    whole grid trains every trial (a full search, also under ``search="halving"``). Returns the record kept in
    results.json's ``budget``: the chosen min_steps, whether logreg was reached, every trial."""
    exact, _ = reference_probe_run(EXACT_PROBE, data, test, cfg, seed, probe_cache)
    target = exact["val_score"] - EXACT_PROBE_TOLERANCE / 100
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
            "logreg_val": float(exact["val_score"]), "tolerance": EXACT_PROBE_TOLERANCE,
            "max_steps": cfg.train.max_steps, "seed": seed, "select": cfg.select, "trials": trials}


def train_seed(data: TrainData, test: tuple[torch.Tensor | StreamedFeatures, torch.Tensor], cfg: ExperimentConfig,
               seed: int, log, bar: Any = None, probe_cache: dict[Any, Any] | None = None
               ) -> tuple[list[dict[str, Any]], dict[str, np.ndarray], dict[str, torch.Tensor]]:
    """Train all methods × grid points of one seed in one stack; select on val; evaluate once on test — with the
    selected head rebuilt alone from its saved parameters, the same computation ``mr2probe predict`` makes.
    Under successive halving the selection is among the heads that reached the budget (``TrainedStack.finished``).
    Returns the runs, the test predictions and the selected heads' parameters ("method/seed/param" → tensor)."""
    stack_methods = [m for m in cfg.methods if m not in REFERENCE_PROBES]
    runs, preds, saved = [], {}, {}
    for name in (m for m in cfg.methods if m in REFERENCE_PROBES):
        run, pred = reference_probe_run(name, data, test, cfg, seed, probe_cache)
        runs.append(run)
        preds[f"{name}/{seed}"] = pred
    if not stack_methods:
        return runs, preds, saved
    specs = expand_runs(stack_methods, [seed], cfg.train)
    t0 = time.time()
    trained = train_stack(data, specs, cfg.train, log, description=f"sweep {len(stack_methods)} methods", bar=bar,
                          select=cfg.select)
    wall = time.time() - t0
    val_logits = trained.predict(data.val_x)
    scores = select_scores(val_logits, data.val_y, data.num_classes, cfg.select)
    finished = trained.finished
    halved = trained.stopped_at is not None
    for method in stack_methods:
        heads = [i for i, s in enumerate(trained.specs) if s.method == method]
        reached = [i for i in heads if finished[i]]  # every head, but under successive halving its survivors
        best = reached[int(np.argmax(scores[reached]))]  # first best on ties
        state = trained.probe.select([best])
        saved.update({f"{method}/{seed}/{k}": v.cpu() for k, v in state.items()})
        test_pred = predict_labels(ProbeStack.from_state(cfg.train.probe, data.x.shape[1], data.num_classes, state)
                                   .to(test[1].device), test[0])[0].cpu().numpy()
        val_pred = val_logits[best].argmax(-1).cpu().numpy()
        yt, yv = test[1].cpu().numpy(), data.val_y.cpu().numpy()
        acc = per_class_accuracy(test_pred, yt, data.num_classes)
        ckpt = trained.checkpoint_step is not None  # the checkpoints rule: each head holds its best checkpoint
        run = {"method": method, "seed": seed, "hparams": trained.specs[best].params,
               "val_score": float(scores[best]), "select": cfg.select,
               "test_acc": float((test_pred == yt).mean()),
               "per_class_acc": acc.tolist(),
               "val_per_class_acc": per_class_accuracy(val_pred, yv, data.num_classes).tolist(),
               "grid": grid_columns([{"hparams": trained.specs[i].params, "val_score": float(scores[i]),
                                      **({"checkpoint_step": trained.checkpoint_step[i]} if ckpt else {}),
                                      **({"stopped_at": trained.stopped_at[i]} if halved else {})}
                                     for i in heads]),
               **({"checkpoint_step": trained.checkpoint_step[best],
                   "checkpoint_val_scores": [float(v) for v in trained.checkpoint_scores[:, best]]} if ckpt else {}),
               "stack_wall_time_s": round(wall, 2), **trained.info[best]}
        runs.append(run)
        preds[f"{method}/{seed}"] = test_pred.astype(np.int16 if data.num_classes < 32000 else np.int32)
    return runs, preds, saved


def run_experiment(cfg: ExperimentConfig) -> dict[str, Any]:
    """Train every (method, seed), write RUN_DIR/results.json and predictions.npz; return the results.

    The features are loaded onto the device if train + val + test as float32 fit in ``cfg.max_memory``, else
    streamed from the file, which stays open until the end."""
    cfg.check()
    t_start = time.time()
    header = read_features(cfg.features, load=False)
    device = pick_device(cfg.train.device)
    max_memory = resolve_max_memory(cfg.max_memory, device)
    feature_bytes = sum(header.rows.values()) * header.dim * 4
    in_memory = feature_bytes <= max_memory
    fs = read_features(cfg.features, load=True if in_memory else "labels")
    check_classes_covered(fs)
    h5 = None if in_memory else h5py.File(cfg.features, "r")
    try:
        data, test, sizes = prepare_data(fs, cfg, device, h5, max_memory)
        return _train_and_write(cfg, fs, device, data, test, sizes, feature_bytes, max_memory, t_start)
    finally:
        if h5 is not None:
            h5.close()


def _train_and_write(cfg: ExperimentConfig, fs: FeatureSet, device: torch.device, data: TrainData,
                     test: tuple[torch.Tensor | StreamedFeatures, torch.Tensor], sizes: dict[str, Any],
                     feature_bytes: int, max_memory: int, t_start: float) -> dict[str, Any]:
    """Train the seed stacks missing from RUN_DIR/parts/ (under torchrun each rank its share), then on rank 0 gather
    every part and write the run folder. A folder that already holds this run's results is kept as it is."""
    features_hash, content_hash = file_sha256(cfg.features), content_sha256(cfg.features)
    streamed = isinstance(data.x, StreamedFeatures)
    stream = {"block_rows": data.x.block_rows, "piece_rows": data.x.piece_rows} if streamed else None
    episodes = _draw_episodes(cfg, data, fs.class_names)
    # the checkpoints rule: a --max-steps below the floor fails here, before anything is written
    checkpoints = {e: checkpoint_steps(len(ep["rows"]), cfg.train) for e, ep in episodes.items()} \
        if cfg.train.budget_rule == "checkpoints" else None
    out = Path(cfg.out)
    _make_out_folder(out)
    notes: list[str] = []

    def log(msg: str) -> None:
        if msg not in notes:
            notes.append(msg)
            console.print(f"[dim]{msg}[/dim]")

    if stream:
        log(f"features ({feature_bytes / 2**20:.1f} MiB as float32) exceed --max-memory ({max_memory / 2**20:.1f} "
            f"MiB): streamed from the file in blocks of {stream['block_rows']} rows ({stream['piece_rows']}-row "
            "pieces); the data order differs from an in-memory run")
    reference = cfg.reference_method
    profile = {**cfg.profile.as_dict(), "describe": cfg.profile.describe()}
    given = cfg  # as given: results.json's config and the run's identity; cfg below carries the budget it gets
    identity = _run_identity(_config_record(given), profile, reference, content_hash, stream)
    rank, world = rank_world()
    probe_cache: dict[Any, Any] = {}
    episode_cache: dict[int, TrainData] = {}

    def episode_data(e: int) -> TrainData:
        if cfg.profile.kind == "full":
            return data
        if e not in episode_cache:  # one copy per episode, so the exact probes' cache sees the same rows
            rows = episodes[e]["rows"]
            episode_cache[e] = TrainData(take_rows(data.x, rows), data.y[torch.as_tensor(rows, device=data.y.device)],
                                         data.val_x, data.val_y, data.num_classes)
        return episode_cache[e]

    calibration = None
    if cfg.train.budget_rule == "reach-logreg":  # one calibration per run folder, kept in parts/ for resuming
        budget_file = out / "parts" / f"budget-{_config_key(given, content_hash, stream)}.json"
        if not budget_file.exists() and (done := _finished(out, identity)) is not None:
            log(FINISHED_BEFORE)
            return done
        calibration = _calibration(budget_file, episode_data, test, cfg, log, probe_cache)
        cfg = replace(cfg, train=replace(cfg.train, min_steps=calibration["min_steps"]))
    jobs = _jobs(cfg, log)
    stacks = _seed_stacks(jobs, out, features_hash, content_hash, stream, log)
    if cfg.profile.kind != "full":
        log(f"training profile {cfg.profile.describe()}: {len(episodes[0]['rows'])} of {len(data.y)} training "
            f"rows per episode; val and test untouched")

    barrier()  # under torchrun every rank lists the finished parts before any rank writes one
    todo = [st for st in stacks if not (st[4].exists() and st[5].exists())]
    if todo and (done := _finished(out, identity)) is not None:  # every rank reads the same files
        log(FINISHED_BEFORE)
        return done
    _train_parts(todo[rank::world], cfg, episodes, episode_data, test, probe_cache, log)
    barrier()
    if rank != 0:
        return {}  # rank 0 gathers the parts and writes the run folder

    runs, preds, heads_state = _gather_parts(stacks, {st[4] for st in todo}, cfg.methods + [null_name(reference)],
                                             log)
    results = {
        "mr2probe_version": __version__,
        "class_names": fs.class_names,
        "test_class_counts": np.bincount(test[1].cpu().numpy(), minlength=fs.num_classes).tolist(),
        "reference": reference,
        "null_control": {"method": jobs[1][2], "seeds": [sd for sd, _ in jobs[1][1]]} if len(jobs) > 1 else None,
        "budget": _budget_record(cfg.train, len(episodes[0]["rows"]), checkpoints, calibration),
        "profile": profile,
        "train_class_counts": episodes[0]["train_class_counts"],
        "episodes": [{k: v for k, v in ep.items() if k != "rows"} for ep in episodes.values()],
        "head": cfg.train.probe.head, "adapter": cfg.train.probe.adapter,
        "config": _config_record(given),
        "provenance": _provenance(cfg.features, fs, sizes, device, max_memory, stream, world, t_start,
                                  features_hash, content_hash),
        "notes": notes,
        "runs": runs,
    }
    if not todo and (kept := _finished(out, identity, results)) is not None:
        console.print("[dim]every seed stack was already trained and the run folder holds these results: kept as it "
                      "is[/dim]")
        if not (out / "heads.safetensors").exists():  # lost since (git keeps none): written again from the parts
            _save_run_heads(out, cfg.train.probe, fs, heads_state)
        return kept
    _write_run(out, cfg.train.probe, fs, test[1].cpu().numpy(), preds, heads_state, results)
    return results


# A seed stack of the run: (its config, part key, seed, episode, part .json, part .npz, name its runs take: None, or
# the null control's name for the reference trained on the null seeds)
_Stack = tuple[ExperimentConfig, str, int, int, Path, Path, str | None]


def _draw_episodes(cfg: ExperimentConfig, data: TrainData, class_names: list[str]) -> dict[int, dict[str, Any]]:
    """The training rows of every episode of the profile, with their draw seed and class counts. A profile the
    data cannot supply fails here, before anything is written."""
    y_train = data.y.cpu().numpy()
    episodes: dict[int, dict[str, Any]] = {}
    for e in range(cfg.profile.episodes):
        rows = select_rows(y_train, cfg.profile, e, data.num_classes, class_names)
        episodes[e] = {"episode": e, "rows": rows, "draw_seed": draw_seed(cfg.profile.seed, e),
                       "train_class_counts": np.bincount(y_train[rows], minlength=data.num_classes).tolist()}
    return episodes


def _make_out_folder(out: Path) -> None:
    """Create ``out/parts/`` and check that a file can be written there (a UserError if not)."""
    try:
        (out / "parts").mkdir(parents=True, exist_ok=True)
        probe_file = out / f".write-test-{os.getpid()}"
        probe_file.write_text("")
        probe_file.unlink()
    except OSError as e:
        raise UserError(f"cannot write to output folder {out}: {e.strerror}; pass another --out") from None


def _calibration(budget_file: Path, episode_data: Callable[[int], TrainData],
                 test: tuple[torch.Tensor | StreamedFeatures, torch.Tensor], cfg: ExperimentConfig,
                 log: Callable[[str], None], probe_cache: dict[Any, Any]) -> dict[str, Any]:
    """The run folder's reach-logreg calibration (:func:`calibrate_budget` on the first replicate): made by rank 0
    unless ``budget_file`` holds it already, then read by every rank."""
    reference = cfg.reference_method
    if rank_world()[0] == 0 and not budget_file.exists():
        atomic_json(budget_file, calibrate_budget(episode_data(0), test, cfg, reference, replicates(cfg)[0][0],
                                                  log, probe_cache))
    barrier()
    calibration = json.loads(budget_file.read_text())
    last = calibration["trials"][-1]
    log(f"budget rule reach-logreg: min_steps {calibration['min_steps']} for every method ({reference} "
        f"{100 * last['reference_val']:.2f} vs {EXACT_PROBE} {100 * calibration['logreg_val']:.2f} on val"
        + ("" if calibration["reached"] else f"; not within {EXACT_PROBE_TOLERANCE:g} point at --max-steps "
           f"{calibration['max_steps']}") + ")")
    return calibration


def _jobs(cfg: ExperimentConfig, log) -> list[tuple[ExperimentConfig, list[tuple[int, int]], str | None]]:
    """(config, (seed, episode) pairs, name of its runs): the methods on cfg.seeds; the null control, the reference
    alone on disjoint seeds (its parts are keyed like any run of that one method, so they are shared with such
    runs)."""
    reference = cfg.reference_method
    reps = replicates(cfg)
    jobs = [(cfg, reps, None)]
    if cfg.null and reference in REFERENCE_PROBES:
        log(f"no null control: the reference {reference} does not depend on the seed")
    elif cfg.null:  # the i-th null seed trains on the i-th replicate's episode: paired by position in the report
        nulls = list(zip(null_seeds([s for s, _ in reps]), [e for _, e in reps]))
        alone = replace(cfg.train, method_params={m: p for m, p in cfg.train.method_params.items() if m == reference})
        jobs.append((replace(cfg, methods=[reference], train=alone), nulls, null_name(reference)))
    return jobs


def _seed_stacks(jobs: list[tuple[ExperimentConfig, list[tuple[int, int]], str | None]], out: Path,
                 features_hash: str, content_hash: str, stream: dict[str, int] | None, log) -> list[_Stack]:
    """Every seed stack of the jobs with its part files in ``out/parts/`` (named by the seed, the episode when the
    profile has several, and the part key); parts an older mr2probe keyed by the file hash are renamed to them."""
    stacks: list[_Stack] = []
    for job_cfg, seeds, rename in jobs:
        key = _config_key(job_cfg, content_hash, stream)
        episodic = job_cfg.profile.episodes > 1
        names = {seed: f"seed{seed}-ep{ep}-{key}" if episodic else f"seed{seed}-{key}" for seed, ep in seeds}
        parts = {seed: (out / "parts" / f"{names[seed]}.json", out / "parts" / f"{names[seed]}.npz")
                 for seed, _ in seeds}
        _adopt_legacy_parts(parts, out / "parts", _config_key(job_cfg, features_hash, stream), log)
        stacks += [(job_cfg, key, seed, ep, *parts[seed], rename) for seed, ep in seeds]
    return stacks


def _train_parts(mine: list[_Stack], cfg: ExperimentConfig, episodes: dict[int, dict[str, Any]],
                 episode_data: Callable[[int], TrainData], test: tuple[torch.Tensor | StreamedFeatures, torch.Tensor],
                 probe_cache: dict[Any, Any], log) -> None:
    """Train the seed stacks ``mine`` under one progress bar (shown on rank 0), writing each one's part files."""
    rank, world = rank_world()
    steps = {e: train_steps(len(episodes[e]["rows"]), cfg.train) for e in episodes}
    heads = len(expand_runs([m for m in cfg.methods if m not in REFERENCE_PROBES], [0], cfg.train))
    with progress_bar(f"sweep: {len(cfg.methods)} methods, {heads} heads per seed; {len(mine)} seed stacks to train"
                      + (f" on rank {rank} of {world}" if world > 1 else ""),
                      total=sum(steps[st[3]] for st in mine), enabled=cfg.train.progress and rank == 0) as bar:
        for stack in mine:
            _train_part(stack, episode_data(stack[3]), test, probe_cache, log, bar)


def _train_part(stack: _Stack, data: TrainData, test: tuple[torch.Tensor | StreamedFeatures, torch.Tensor],
                probe_cache: dict[Any, Any], log, bar: Any) -> None:
    """Train one seed stack and write its part files (runs + the notes logged while training, test predictions,
    selected heads)."""
    job_cfg, key, seed, ep, part, part_npz, _ = stack
    said: list[str] = []

    def seed_log(msg: str) -> None:
        said.append(msg)
        log(msg)

    seed_runs, seed_preds, seed_heads = train_seed(data, test, job_cfg, seed, seed_log, bar, probe_cache)
    save_heads(part.with_suffix(".heads.safetensors"), seed_heads)
    save_predictions(part_npz, seed_preds)
    atomic_json(part, {"key": key, "runs": [{**r, "episode": ep} for r in seed_runs], "notes": said})


def _gather_parts(stacks: list[_Stack], fresh: set[Path], order: list[str], log
                  ) -> tuple[list[dict[str, Any]], dict[str, np.ndarray], dict[str, torch.Tensor]]:
    """The runs (sorted by ``order`` of their methods, then seed), test predictions and heads of every seed stack,
    read from its part files; the null control's under its own name. Logs which stacks were trained before (not
    in ``fresh``) and the notes each part holds."""
    runs: list[dict[str, Any]] = []
    preds: dict[str, np.ndarray] = {}
    heads_state: dict[str, torch.Tensor] = {}
    for _, _, seed, _, part, part_npz, rename in stacks:
        part_heads = part.with_suffix(".heads.safetensors")
        stored = json.loads(part.read_text())
        if part not in fresh:
            log(f"seed {seed}{' (null control)' if rename else ''}: already trained ({part.name}), kept")
        for msg in stored.get("notes", []):  # said while training it (here, on another rank or in an earlier run)
            log(msg)
        seed_runs, seed_preds = stored["runs"], load_predictions(part_npz)
        seed_heads = load_heads(part_heads) if part_heads.exists() else {}
        if not seed_heads:
            log(f"seed {seed}: trained by an older mr2probe, no saved heads (mr2probe predict skips it)")
        if rename:
            seed_runs = [{**r, "method": rename} for r in seed_runs]
            seed_preds = {f"{rename}/{k.split('/', 1)[1]}": v for k, v in seed_preds.items()}
            seed_heads = {f"{rename}/{k.split('/', 1)[1]}": v for k, v in seed_heads.items()}
        runs += seed_runs
        preds.update(seed_preds)
        heads_state.update(seed_heads)
    rank_of = {m: i for i, m in enumerate(order)}
    runs.sort(key=lambda r: (rank_of[r["method"]], r["seed"]))
    return runs, preds, heads_state


def _budget_record(train: TrainConfig, n_rows: int, checkpoints: dict[int, list[int]] | None,
                   calibration: dict[str, Any] | None) -> dict[str, Any]:
    """results.json's ``budget``: the steps every head trains on ``n_rows`` rows (an episode's) and the rule that
    fixed them, with the rule's calibration or checkpoints and successive halving's rungs when there are any."""
    epochs, per_epoch = budget(n_rows, train)
    if checkpoints:  # trained to the last checkpoint; each run's own step is its checkpoint_step
        epochs = checkpoints[0][-1] // per_epoch
    search = search_schedule(n_rows, train)  # successive halving's rungs (None: full)
    return {"steps": epochs * per_epoch, "epochs": epochs, "steps_per_epoch": per_epoch,
            "min_steps": train.min_steps, "batch_size": train.batch_size,
            "rule": BUDGET_RULES[train.budget_rule],
            **({"calibration": calibration} if calibration else {}),
            **({"checkpoints": checkpoints[0], "floor_steps": checkpoints[0][0],
                "max_steps": train.max_steps} if checkpoints else {}),
            **({"search": search} if search else {})}


def _provenance(features: Path, fs: FeatureSet, sizes: dict[str, Any], device: torch.device, max_memory: int,
                stream: dict[str, int] | None, world: int, t_start: float, features_hash: str,
                content_hash: str) -> dict[str, Any]:
    """results.json's ``provenance``: the features, software, machine and command that made the run."""
    return {
        "features": str(features), "features_sha256": features_hash,
        "features_content_sha256": content_hash, "encoder": fs.encoder,
        "dataset": fs.dataset, "feature_dim": fs.dim, "splits": sizes,
        "feature_file_attrs": {k: v for k, v in fs.attrs.items() if k != "class_names"},
        "torch": str(torch.__version__), "numpy": np.__version__, "mr2probe": __version__,
        "python": platform.python_version(), "device": str(device),
        "features_in_memory": stream is None, "max_memory_bytes": max_memory,
        "stream_block_rows": stream["block_rows"] if stream else None,
        "stream_piece_rows": stream["piece_rows"] if stream else None,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "world_size": world,
        "wall_time_s": round(time.time() - t_start, 2), "command": " ".join(sys.argv),
    }


def _write_run(out: Path, probe: ProbeConfig, fs: FeatureSet, test_labels: np.ndarray,
               preds: dict[str, np.ndarray], heads_state: dict[str, torch.Tensor], results: dict[str, Any]) -> None:
    """Write the run folder: predictions.npz (the test labels and every run's predictions), heads.safetensors
    (every selected head, with what ``mr2probe predict`` needs to rebuild it) and, last, results.json."""
    save_predictions(out / "predictions.npz", {LABELS: test_labels, **preds})
    _save_run_heads(out, probe, fs, heads_state)
    atomic_json(out / "results.json", results)


def _save_run_heads(out: Path, probe: ProbeConfig, fs: FeatureSet, heads_state: dict[str, torch.Tensor]) -> None:
    """heads.safetensors: every selected head, with what ``mr2probe predict`` needs to rebuild it."""
    meta = {"format": HEADS_FORMAT, "probe": json.dumps(asdict(probe)), "in_dim": str(fs.dim),
            "num_classes": str(fs.num_classes), "class_names": json.dumps(fs.class_names)}
    save_heads(out / "heads.safetensors", heads_state, meta)
