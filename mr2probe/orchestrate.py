"""Running the train stage: the data (val from the file, else a stratified hold-out of train; the training
profile's episodes), the seed stacks (the methods on the seeds, the null control on disjoint seeds), each trained
unless its part files are there (so a killed run resumes; under torchrun each rank trains its share), then on rank 0
the run folder written from every part (:mod:`~mr2probe.runstore`). A folder that already holds the same run's
results is kept as it is.

Features (train + val + test as float32) that fit in ``max_memory`` are loaded onto the training device;
larger files are validated chunk by chunk and streamed from the file during training (``source.py``)."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import h5py
import numpy as np
import torch

from . import __version__
from .distributed import barrier, rank_world
from .featurestore import (FeatureSet, check_classes_covered, content_sha256, file_sha256, read_features,
                           row_sources)
from .jsonfile import atomic_json
from .metrics import null_name
from .probes import REFERENCE_PROBES
from .profiles import draw_seed, select_rows
from .progress import console, progress_bar
from .results import RunRecord, RunResults
from .runconfig import ExperimentConfig, null_seeds, replicates
from .runstore import (FINISHED_BEFORE, SeedStack, _config_key, budget_record, config_record, finished,
                       make_out_folder, provenance, read_part, run_identity, save_run_heads, seed_stacks, write_part,
                       write_run)
from .selection import Features, Log, Test, calibrate_budget, refit_note, refit_steps, train_seed
from .settings import EXACT_PROBE, EXACT_PROBE_TOLERANCE
from .source import StreamedFeatures, resolve_max_memory, stream_layout
from .trainer import EpochHook, TrainData, checkpoint_steps, expand_runs, pick_device, train_steps

StackHook = Callable[[int, int, dict[str, float]], None]
"""(seed, epochs done, method → its best val score) at the end of every epoch of a seed stack."""


# ---- data --------------------------------------------------------------------------------------------------

def take_rows(x: Features, rows: np.ndarray) -> Features:
    """The rows ``rows`` (sorted positions) of a feature matrix, in memory or streamed from the file."""
    if isinstance(x, StreamedFeatures):
        base = np.arange(x.ds.shape[0]) if x.rows is None else x.rows
        return StreamedFeatures(x.ds, base[rows], x.device, x.block_rows, x.piece_rows, x.dtype)
    return x[torch.as_tensor(rows, device=x.device)]


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
                 max_memory: int = 0) -> tuple[TrainData, Test, dict[str, Any]]:
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


def draw_episodes(cfg: ExperimentConfig, data: TrainData, class_names: list[str]) -> dict[int, dict[str, Any]]:
    """The training rows of every episode of the profile, with their draw seed and class counts. A profile the
    data cannot supply fails here, before anything is written."""
    y_train = data.y.cpu().numpy()
    episodes: dict[int, dict[str, Any]] = {}
    for e in range(cfg.profile.episodes):
        rows = select_rows(y_train, cfg.profile, e, data.num_classes, class_names)
        episodes[e] = {"episode": e, "rows": rows, "draw_seed": draw_seed(cfg.profile.seed, e),
                       "train_class_counts": np.bincount(y_train[rows], minlength=data.num_classes).tolist()}
    return episodes


# ---- one run -----------------------------------------------------------------------------------------------

@dataclass
class Run:
    """What training one run folder holds on to: the config (``cfg`` with the budget it gets; ``given`` as
    given), features and data, the profile's episodes, the streamed layout, hashes and the notes logged."""

    cfg: ExperimentConfig
    fs: FeatureSet
    device: torch.device
    data: TrainData
    test: Test
    sizes: dict[str, Any]
    max_memory: int
    t_start: float
    episodes: dict[int, dict[str, Any]] = field(default_factory=dict)
    stream: dict[str, int] | None = None
    features_hash: str = ""
    content_hash: str = ""
    notes: list[str] = field(default_factory=list)
    probe_cache: dict[Any, Any] = field(default_factory=dict)
    episode_cache: dict[int, TrainData] = field(default_factory=dict)
    calibration: dict[str, Any] | None = None
    on_epoch: StackHook | None = None  # each seed stack's val scores at its epoch ends (an experiment tracker)

    def __post_init__(self) -> None:
        self.given = self.cfg  # as given: results.json's config and the run's identity
        self.out = Path(self.cfg.out)

    def log(self, msg: str) -> None:
        """Print a note once and keep it for results.json."""
        if msg not in self.notes:
            self.notes.append(msg)
            console.print(f"[dim]{msg}[/dim]")

    def episode_data(self, e: int) -> TrainData:
        """The training data of episode ``e`` (one copy per episode, so the exact probes' cache sees the same
        rows); the whole training set under the full profile."""
        if self.cfg.profile.kind == "full":
            return self.data
        if e not in self.episode_cache:
            rows, d = self.episodes[e]["rows"], self.data
            self.episode_cache[e] = TrainData(take_rows(d.x, rows), d.y[torch.as_tensor(rows, device=d.y.device)],
                                              d.val_x, d.val_y, d.num_classes)
        return self.episode_cache[e]

    @property
    def identity(self) -> str:
        profile = {**self.cfg.profile.as_dict(), "describe": self.cfg.profile.describe()}
        return run_identity(config_record(self.given), profile, self.given.reference_method, self.content_hash,
                            self.stream)


def run_experiment(cfg: ExperimentConfig, on_epoch: StackHook | None = None) -> dict[str, Any]:
    """Train every (method, seed), write RUN_DIR/results.json and predictions.npz; return the results as
    results.json holds them (:meth:`RunResults.to_dict`; ``{}`` on ranks other than 0 under torchrun).
    ``on_epoch(seed, epochs done, method → best val score)`` at the end of every epoch of each seed stack this
    process trains (:data:`StackHook`; the null control's scores under its name; :mod:`mr2probe.tracking`).

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
        run = Run(cfg, fs, device, data, test, sizes, max_memory, t_start, on_epoch=on_epoch)
        results = _train_and_write(run, feature_bytes)
        return results.to_dict() if results is not None else {}
    finally:
        if h5 is not None:
            h5.close()


def _start(run: Run, feature_bytes: int) -> dict[int, list[int]] | None:
    """Hashes, episodes and the output folder of ``run``; the checkpoints rule's checkpoints per episode (a
    --max-steps below the floor fails here, before anything is written)."""
    cfg = run.cfg
    run.features_hash, run.content_hash = file_sha256(cfg.features), content_sha256(cfg.features)
    if isinstance(run.data.x, StreamedFeatures):
        run.stream = {"block_rows": run.data.x.block_rows, "piece_rows": run.data.x.piece_rows}
    run.episodes = draw_episodes(cfg, run.data, run.fs.class_names)
    checkpoints = {e: checkpoint_steps(len(ep["rows"]), cfg.train) for e, ep in run.episodes.items()} \
        if cfg.train.budget_rule == "checkpoints" else None
    make_out_folder(run.out)
    if run.stream:
        cap = run.max_memory / 2**20
        run.log(f"features ({feature_bytes / 2**20:.1f} MiB as float32) exceed --max-memory ({cap:.1f} MiB): "
                f"streamed from the file in blocks of {run.stream['block_rows']} rows "
                f"({run.stream['piece_rows']}-row pieces); the data order differs from an in-memory run")
    if cfg.refit:
        run.log(refit_note(len(run.data.y), len(run.data.val_y)))
    return checkpoints


def _train_and_write(run: Run, feature_bytes: int) -> RunResults | None:
    """Train the seed stacks missing from RUN_DIR/parts/ (under torchrun each rank its share), then on rank 0 gather
    every part and write the run folder. A folder that already holds this run's results is kept as it is."""
    checkpoints = _start(run, feature_bytes)
    identity = run.identity
    if run.cfg.train.budget_rule == "reach-logreg":  # one calibration per run folder, kept in parts/ for resuming
        budget_file = run.out / "parts" / f"budget-{_config_key(run.given, run.content_hash, run.stream)}.json"
        if not budget_file.exists() and (done := finished(run.out, identity)) is not None:
            run.log(FINISHED_BEFORE)
            return done
        run.calibration = _calibration(budget_file, run)
        run.cfg = replace(run.cfg, train=replace(run.cfg.train, min_steps=run.calibration["min_steps"]))
    jobs = _jobs(run.cfg, run.log)
    stacks = [st for job in jobs for st in seed_stacks(*job, run.out, run.features_hash, run.content_hash,
                                                       run.stream, run.log)]
    if run.cfg.profile.kind != "full":
        run.log(f"training profile {run.cfg.profile.describe()}: {len(run.episodes[0]['rows'])} of "
                f"{len(run.data.y)} training rows per episode; val and test untouched")
    barrier()  # under torchrun every rank lists the finished parts before any rank writes one
    todo = [st for st in stacks if not st.done]
    if todo and (done := finished(run.out, identity)) is not None:  # every rank reads the same files
        run.log(FINISHED_BEFORE)
        return done
    rank, world = rank_world()
    _train_parts(todo[rank::world], run)
    barrier()
    if rank != 0:
        return None  # rank 0 gathers the parts and writes the run folder
    return _write(run, jobs, stacks, {st.json for st in todo}, checkpoints, identity)


def _write(run: Run, jobs: list[tuple[ExperimentConfig, list[tuple[int, int]], str | None]], stacks: list[SeedStack],
           fresh: set[Path], checkpoints: dict[int, list[int]] | None, identity: str) -> RunResults:
    """Gather the parts into the run's results and write the run folder, unless it holds these results already."""
    cfg, fs, test_labels = run.cfg, run.fs, run.test[1].cpu().numpy()
    runs, preds, heads_state = _gather_parts(stacks, fresh, cfg.methods + [null_name(cfg.reference_method)], run.log)
    results = RunResults(
        mr2probe_version=__version__, class_names=fs.class_names,
        test_class_counts=np.bincount(test_labels, minlength=fs.num_classes).tolist(),
        reference=cfg.reference_method,
        null_control={"method": jobs[1][2], "seeds": [sd for sd, _ in jobs[1][1]]} if len(jobs) > 1 else None,
        budget=budget_record(cfg.train, len(run.episodes[0]["rows"]), checkpoints, run.calibration),
        profile={**cfg.profile.as_dict(), "describe": cfg.profile.describe()},
        train_class_counts=run.episodes[0]["train_class_counts"],
        episodes=[{k: v for k, v in ep.items() if k != "rows"} for ep in run.episodes.values()],
        head=cfg.train.probe.head, adapter=cfg.train.probe.adapter, config=config_record(run.given),
        provenance=provenance(cfg.features, fs, run.sizes, run.device, run.max_memory, run.stream, rank_world()[1],
                              run.t_start, run.features_hash, run.content_hash),
        notes=run.notes, runs=runs)
    if not fresh and (kept := finished(run.out, identity, results)) is not None:
        console.print("[dim]every seed stack was already trained and the run folder holds these results: kept as it "
                      "is[/dim]")
        if not (run.out / "heads.safetensors").exists():  # lost since (git keeps none): written again from the parts
            save_run_heads(run.out, cfg.train.probe, fs, heads_state)
        return kept
    write_run(run.out, cfg.train.probe, fs, test_labels, preds, heads_state, results, row_sources(cfg.features, "test"))
    return results


def _calibration(budget_file: Path, run: Run) -> dict[str, Any]:
    """The run folder's reach-logreg calibration (:func:`calibrate_budget` on the first replicate): made by rank 0
    unless ``budget_file`` holds it already, then read by every rank."""
    cfg, reference = run.cfg, run.cfg.reference_method
    if rank_world()[0] == 0 and not budget_file.exists():
        atomic_json(budget_file, calibrate_budget(run.episode_data(0), run.test, cfg, reference,
                                                  replicates(cfg)[0][0], run.log, run.probe_cache))
    barrier()
    calibration = json.loads(budget_file.read_text())
    last = calibration["trials"][-1]
    run.log(f"budget rule reach-logreg: min_steps {calibration['min_steps']} for every method ({reference} "
            f"{100 * last['reference_val']:.2f} vs {EXACT_PROBE} {100 * calibration['logreg_val']:.2f} on val"
            + ("" if calibration["reached"] else f"; not within {EXACT_PROBE_TOLERANCE:g} point at --max-steps "
               f"{calibration['max_steps']}") + ")")
    return calibration


def _jobs(cfg: ExperimentConfig, log: Log) -> list[tuple[ExperimentConfig, list[tuple[int, int]], str | None]]:
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


def _train_parts(mine: list[SeedStack], run: Run) -> None:
    """Train the seed stacks ``mine`` under one progress bar (shown on rank 0), writing each one's part files."""
    rank, world = rank_world()
    cfg = run.cfg
    steps = {e: train_steps(len(ep["rows"]), cfg.train)
             + (refit_steps(len(ep["rows"]), len(run.data.val_y), cfg.train) if cfg.refit else 0)
             for e, ep in run.episodes.items()}
    heads = len(expand_runs([m for m in cfg.methods if m not in REFERENCE_PROBES], [0], cfg.train))
    with progress_bar(f"sweep: {len(cfg.methods)} methods, {heads} heads per seed; {len(mine)} seed stacks to train"
                      + (f" on rank {rank} of {world}" if world > 1 else ""),
                      total=sum(steps[st.episode] for st in mine), enabled=cfg.train.progress and rank == 0) as bar:
        for stack in mine:
            _train_part(stack, run, bar)


def _train_part(stack: SeedStack, run: Run, bar: Any) -> None:
    """Train one seed stack and write its part files (runs + the notes logged while training, test predictions,
    selected heads)."""
    said: list[str] = []

    def seed_log(msg: str) -> None:
        said.append(msg)
        run.log(msg)

    runs, preds, heads = train_seed(run.episode_data(stack.episode), run.test, stack.cfg, stack.seed, seed_log, bar,
                                    run.probe_cache,
                                    on_epoch=_stack_hook(run.on_epoch, stack))
    for r in runs:
        r.episode = stack.episode
    write_part(stack, runs, preds, heads, said)


def _stack_hook(on_epoch: StackHook | None, stack: SeedStack) -> EpochHook | None:
    """``on_epoch`` for one seed stack's epochs: its seed, and the null control's scores under its name."""
    if on_epoch is None:
        return None
    return lambda epoch, scores: on_epoch(stack.seed, epoch, {stack.rename or m: v for m, v in scores.items()})


def _gather_parts(stacks: list[SeedStack], fresh: set[Path], order: list[str], log: Callable[[str], None]
                  ) -> tuple[list[RunRecord], dict[str, np.ndarray], dict[str, torch.Tensor]]:
    """The runs (sorted by ``order`` of their methods, then seed), test predictions and heads of every seed stack,
    read from its part files. Logs which stacks were trained before (not in ``fresh``) and the notes each part
    holds (said while training it: here, on another rank or in an earlier run)."""
    runs: list[RunRecord] = []
    preds: dict[str, np.ndarray] = {}
    heads_state: dict[str, torch.Tensor] = {}
    for st in stacks:
        if st.json not in fresh:
            log(f"seed {st.seed}{' (null control)' if st.rename else ''}: already trained ({st.json.name}), kept")
        seed_runs, seed_preds, seed_heads, notes = read_part(st, log)
        for msg in notes:
            log(msg)
        runs += seed_runs
        preds.update(seed_preds)
        heads_state.update(seed_heads)
    rank_of = {m: i for i, m in enumerate(order)}
    runs.sort(key=lambda r: (rank_of[r.method], r.seed))
    return runs, preds, heads_state
