"""The run folder's files: the seed stacks' part files in ``RUN_DIR/parts/`` (named by a key of every setting that
changes the numbers, so a killed or repeated run finds the seeds it finished), the heads files (safetensors), and
results.json (:class:`~mr2probe.results.RunResults`) with its config and provenance records. Part keys stay
those of earlier versions: parts keyed by the feature file's hash are adopted, and settings added since are left out
of a key at their old behaviour."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from . import __version__
from .atomic import atomic_write
from .errors import UserError
from .featurestore import FeatureSet
from .heads import ProbeConfig
from .jsonfile import atomic_json
from .predfile import LABELS, SOURCES, load_predictions, save_predictions
from .results import LEGACY_TRAIN_NAMES, Budget, RunRecord, RunResults
from .runconfig import ExperimentConfig
from .settings import BUDGET_RULES
from .trainer import TrainConfig, budget, search_schedule

HEADS_FORMAT = "mr2probe.heads/1"
LINEAR_KEY_SCALES = (8.0, 16.0, 32.0, 64.0)  # the value of the ``scale`` grid in every linear-head part key
KEY_NAMES = {new: old for old, new in LEGACY_TRAIN_NAMES.items()}
"""The part key's name of each :class:`TrainConfig` field that was renamed to its setting's name (lr → lrs, wd →
weight_decays, l2 → l2s, scale → scales, method_grid → use_method_grids: the field names the keys of earlier parts
were hashed under, as results.json held them then): a part key is built under those names, so a resumed run still
finds the parts it finished before the rename."""
ENGINE_SETTINGS = ("compile", "cuda_graph", "tf32", "log")  # how a GPU runs the step (the same heads within float
# rounding) and the experiment tracker the run is logged to: not part of a part key or a run's identity
FINISHED_BEFORE = ("this run is finished: the folder's results.json was made by the same settings from features of the "
                   "same content (its parts/ are gone, e.g. in a fresh clone): kept as it is, nothing trained")
Log = Callable[[str], None]


# ---- heads files -------------------------------------------------------------------------------------------

def load_heads(path: Path) -> dict[str, torch.Tensor]:
    """A heads file written by a run (safetensors: tensors only, no pickled code)."""
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


def save_run_heads(out: Path, probe: ProbeConfig, fs: FeatureSet, heads_state: dict[str, torch.Tensor]) -> None:
    """heads.safetensors: every selected head, with what ``mr2probe predict`` needs to rebuild it."""
    meta = {"format": HEADS_FORMAT, "probe": json.dumps(asdict(probe)), "in_dim": str(fs.dim),
            "num_classes": str(fs.num_classes), "class_names": json.dumps(fs.class_names)}
    save_heads(out / "heads.safetensors", heads_state, meta)


# ---- part keys ---------------------------------------------------------------------------------------------

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
    train = {KEY_NAMES.get(k, k): v for k, v in _keyed_train(asdict(cfg.train)).items()}
    if cfg.train.probe.head != "cosine":
        # the cosine scale (grid, start value, learnable) does not touch a linear head: its key holds fixed values,
        # those of the default before the grid was widened to 256, so that parts finished then are still found
        train[KEY_NAMES["scale"]] = LINEAR_KEY_SCALES
        train["probe"] = {**train["probe"], "scale": LINEAR_KEY_SCALES[0], "learn_scale": False}
    key = {"features": features_hash, "methods": cfg.methods, "train": train, "select": cfg.select,
           "val": [cfg.val_fraction, cfg.val_seed]}
    if cfg.profile.kind != "full":  # only then, so keys of full-set runs are unchanged
        key["profile"] = cfg.profile.as_dict()
    if cfg.train.probe.head == "cosine" and any(m == "mr2" or m.startswith("mr2_") for m in cfg.methods):
        key["mr2_stats_on"] = "input"  # MR2's default under a cosine head since parts trained on z/‖z‖: not reused
    if stream:
        key["stream"] = stream
    if cfg.refit:  # only then, so keys of runs without the refit are unchanged
        key["refit"] = True
    blob = json.dumps(key, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _adopt_legacy_parts(parts: dict[int, tuple[Path, Path]], folder: Path, legacy_key: str, log: Log) -> None:
    """Seeds finished by earlier versions, whose parts were keyed by the feature file's sha256 (which changes
    with its timestamp), are renamed to the content-based key instead of being trained again."""
    for seed, (pj, pn) in parts.items():
        old_j, old_n = folder / f"seed{seed}-{legacy_key}.json", folder / f"seed{seed}-{legacy_key}.npz"
        if not (pj.exists() and pn.exists()) and old_j.exists() and old_n.exists():
            os.replace(old_n, pn)
            os.replace(old_j, pj)
            log(f"seed {seed}: part keyed by the file hash (older mr2probe) renamed to {pj.name}")


# ---- part files --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SeedStack:
    """A seed stack of the run: its config and part key, seed and episode, part files (``json``: runs and notes,
    ``npz``: test predictions, ``heads``: selected heads), and ``rename``: None, or the null control's name for the
    reference trained on the null seeds."""

    cfg: ExperimentConfig
    key: str
    seed: int
    episode: int
    json: Path
    npz: Path
    rename: str | None = None

    @property
    def heads(self) -> Path:
        return self.json.with_suffix(".heads.safetensors")

    @property
    def done(self) -> bool:
        """Whether its part files are there (trained by this or an earlier run)."""
        return self.json.exists() and self.npz.exists()


def seed_stacks(job_cfg: ExperimentConfig, seeds: list[tuple[int, int]], rename: str | None, out: Path,
                features_hash: str, content_hash: str, stream: dict[str, int] | None, log: Log) -> list[SeedStack]:
    """The job's seed stacks with their part files in ``out/parts/`` (named by the seed, the episode when the
    profile has several, and the part key); parts an older mr2probe keyed by the file hash are renamed to them."""
    key = _config_key(job_cfg, content_hash, stream)
    episodic = job_cfg.profile.episodes > 1
    names = {seed: f"seed{seed}-ep{ep}-{key}" if episodic else f"seed{seed}-{key}" for seed, ep in seeds}
    parts = {seed: (out / "parts" / f"{names[seed]}.json", out / "parts" / f"{names[seed]}.npz") for seed, _ in seeds}
    _adopt_legacy_parts(parts, out / "parts", _config_key(job_cfg, features_hash, stream), log)
    return [SeedStack(job_cfg, key, seed, ep, *parts[seed], rename) for seed, ep in seeds]


def write_part(stack: SeedStack, runs: list[RunRecord], preds: dict[str, np.ndarray],
               heads: dict[str, torch.Tensor], notes: list[str]) -> None:
    """A trained seed stack's part files: heads, test predictions, then the runs and the notes said training it."""
    save_heads(stack.heads, heads)
    save_predictions(stack.npz, preds)
    atomic_json(stack.json, {"key": stack.key, "runs": [r.to_dict() for r in runs], "notes": notes})


def read_part(stack: SeedStack, log: Log) -> tuple[list[RunRecord], dict[str, np.ndarray], dict[str, torch.Tensor],
                                                    list[str]]:
    """A seed stack's runs, test predictions, heads and notes from its part files; the null control's under its
    own name."""
    stored = json.loads(stack.json.read_text())
    runs = [RunRecord.from_dict(r) for r in stored["runs"]]
    preds = load_predictions(stack.npz)
    heads = load_heads(stack.heads) if stack.heads.exists() else {}
    if not heads:
        log(f"seed {stack.seed}: trained by an older mr2probe, no saved heads (mr2probe predict skips it)")
    if stack.rename:
        for r in runs:
            r.method = stack.rename
        preds = {f"{stack.rename}/{k.split('/', 1)[1]}": v for k, v in preds.items()}
        heads = {f"{stack.rename}/{k.split('/', 1)[1]}": v for k, v in heads.items()}
    return runs, preds, heads, stored.get("notes", [])


# ---- results.json ------------------------------------------------------------------------------------------

def config_record(cfg: ExperimentConfig) -> dict[str, Any]:
    """results.json's ``config``: the run's settings as given."""
    return {"methods": cfg.methods, "seeds": cfg.seeds, "null": cfg.null, "select": cfg.select,
            "val_fraction": cfg.val_fraction, "val_seed": cfg.val_seed, "train": asdict(cfg.train),
            "max_memory": cfg.max_memory, **({"refit": True} if cfg.refit else {})}


def run_identity(config: dict[str, Any], profile: dict[str, Any], reference: str, content_hash: str | None,
                 stream: dict[str, Any] | None) -> str:
    """What fixes a run's numbers, as a string: every setting its part keys hold (the training settings without
    progress bars and chunking, and without the cosine scale on a linear head), the seeds, the null control and
    its reference, the profile, the features' content and the streamed order. Built alike from a results.json
    and from the command being run."""
    config = json.loads(json.dumps(config, default=str))  # tuples as lists, as results.json holds them
    train = _keyed_train(config["train"])
    if train["probe"]["head"] != "cosine":
        train = {**train, "scale": None, "probe": {**train["probe"], "scale": None, "learn_scale": None}}
    ident = {"train": train, "reference": reference, "features": content_hash, "stream": stream,
             "profile": {k: v for k, v in profile.items() if k != "describe"},
             **{k: config[k] for k in ("methods", "seeds", "null", "select", "val_fraction", "val_seed")},
             **({"refit": True} if config.get("refit") else {})}
    return json.dumps(ident, sort_keys=True, default=str)


def results_identity(res: RunResults) -> str:
    """:func:`run_identity` of a results.json."""
    prov = res.provenance
    stream = ({"block_rows": prov["stream_block_rows"], "piece_rows": prov["stream_piece_rows"]}
              if prov.get("stream_block_rows") is not None else None)
    return run_identity(res.config, res.profile, res.reference, prov.get("features_content_sha256"), stream)


def finished(out: Path, identity: str, results: RunResults | None = None) -> RunResults | None:
    """The folder's results.json when it was made by a run of the same identity (:func:`run_identity`) and its
    predictions are there: the run is finished even when its parts/ and heads are gone (neither is kept in git,
    so a fresh clone of a committed run has none), and it is kept as it is instead of trained again. With
    ``results`` (every seed stack was found in parts/), only when it also holds those numbers
    (:meth:`RunResults.numbers`): re-running a finished command rewrites nothing, so the first run's provenance
    is kept."""
    try:
        old = RunResults.from_disk(out / "results.json")
        made_by = results_identity(old)
    except (UserError, KeyError, TypeError):
        return None
    same = results is None or old.numbers() == results.numbers()
    return old if made_by == identity and (out / "predictions.npz").exists() and same else None


def budget_record(train: TrainConfig, n_rows: int, checkpoints: dict[int, list[int]] | None,
                  calibration: dict[str, Any] | None) -> Budget:
    """results.json's ``budget``: the steps every head trains on ``n_rows`` rows (an episode's) and the rule that
    fixed them, with the rule's calibration or checkpoints and successive halving's rungs when there are any."""
    epochs, per_epoch = budget(n_rows, train)
    marks = checkpoints[0] if checkpoints else None
    if marks:  # trained to the last checkpoint; each run's own step is its checkpoint_step
        epochs = marks[-1] // per_epoch
    return Budget(steps=epochs * per_epoch, epochs=epochs, steps_per_epoch=per_epoch, min_steps=train.min_steps,
                  batch_size=train.batch_size, rule=BUDGET_RULES[train.budget_rule], calibration=calibration,
                  checkpoints=marks, floor_steps=marks[0] if marks else None,
                  max_steps=train.max_steps if marks else None, search=search_schedule(n_rows, train))


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


def provenance(features: Path, fs: FeatureSet, sizes: dict[str, Any], device: torch.device, max_memory: int,
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


def make_out_folder(out: Path) -> None:
    """Create ``out/parts/`` and check that a file can be written there (a UserError if not)."""
    try:
        (out / "parts").mkdir(parents=True, exist_ok=True)
        probe_file = out / f".write-test-{os.getpid()}"
        probe_file.write_text("")
        probe_file.unlink()
    except OSError as e:
        raise UserError(f"cannot write to output folder {out}: {e.strerror}; pass another --out") from None


def write_run(out: Path, probe: ProbeConfig, fs: FeatureSet, test_labels: np.ndarray,
              preds: dict[str, np.ndarray], heads_state: dict[str, torch.Tensor], results: RunResults,
              test_sources: np.ndarray | None = None) -> None:
    """Write the run folder: predictions.npz (the test labels, the test rows' sources and every run's
    predictions), heads.safetensors (every selected head, with what ``mr2probe predict`` needs to rebuild it) and,
    last, results.json."""
    sources = {} if test_sources is None else {SOURCES: test_sources}
    save_predictions(out / "predictions.npz", {LABELS: test_labels, **sources, **preds})
    save_run_heads(out, probe, fs, heads_state)
    results.write(out / "results.json")
