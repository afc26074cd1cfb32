"""The train stage: feature file → runs of every (method, seed) with the grid selected on val → results.json.

Protocol (../shared/spec/protocol.md): val is the file's val split, else a stratified hold-out of train
(``val_fraction``, fixed ``val_seed``, the same for every run). For each (method, seed) the grid point with
the best val score (``select``: "acc" overall or "macc" mean per-class accuracy) is kept and evaluated once on
test. Each seed's stack is saved to ``RUN_DIR/parts/`` as soon as it finishes, so a killed run resumes
without retraining finished seeds. Under the ``checkpoints`` budget rule each head is in its best checkpoint's
state (trainer.py), so the selection picks (checkpoint step, lr, wd, method parameters) per method. Under
``search="halving"`` (successive halving, trainer.py) each method's grid is cut on val at the rungs and the
selection is among the heads that reached the budget; every grid entry records the step its head stopped at.

The stage is four modules, one job each, whose public names this module gathers:

* :mod:`~mr2probe.runconfig` — the settings (:class:`ExperimentConfig`, :func:`config_from_settings`);
* :mod:`~mr2probe.runstore` — the run folder's files (part files and their keys, heads files, results.json's
  config, budget and provenance records; :mod:`~mr2probe.results` is the results.json model);
* :mod:`~mr2probe.selection` — one seed's stack trained and its grid selected on val, the exact probes, the
  reach-logreg budget calibration;
* :mod:`~mr2probe.orchestrate` — the data, the seed stacks, resuming, torchrun ranks, :func:`run_experiment`.
"""
from __future__ import annotations

from .orchestrate import draw_episodes, holdout_val, prepare_data, run_experiment, take_rows
from .results import RunRecord, RunResults
from .runconfig import SELECT_METRICS, ExperimentConfig, config_from_settings, null_seeds, replicates
from .runstore import (ENGINE_SETTINGS, FINISHED_BEFORE, HEADS_FORMAT, LINEAR_KEY_SCALES, _config_key, _keyed_train,
                       config_record, cpu_name, load_heads, run_identity, save_heads)
from .selection import calibrate_budget, predict_labels, reference_probe_run, train_seed
from .trainer import select_scores

__all__ = ["ENGINE_SETTINGS", "FINISHED_BEFORE", "HEADS_FORMAT", "LINEAR_KEY_SCALES", "SELECT_METRICS",
           "ExperimentConfig", "RunRecord", "RunResults", "_config_key", "_keyed_train", "calibrate_budget",
           "config_from_settings", "config_record", "cpu_name", "draw_episodes", "holdout_val", "load_heads",
           "null_seeds", "predict_labels", "prepare_data", "reference_probe_run", "replicates", "run_experiment",
           "run_identity", "save_heads", "select_scores", "take_rows", "train_seed"]
