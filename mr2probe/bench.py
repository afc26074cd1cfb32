"""Benchmark suites: one TOML file → extract → train → report for a grid of runs and named runs, + a summary.

``mr2probe bench SUITE.toml [--data-root DIR] [--features-dir DIR] [--out DIR] [--report-only]``. A suite names
its run folders in two ways, which may be combined:

- the **grid**: every dataset × encoder × head × training profile. For every *cell* (dataset × encoder) the
  features are extracted into ``FEATURES_DIR/<dataset>-<encoder>[-pc<N>].h5`` (a finished file there is kept,
  not recomputed; an interrupted one is resumed), then every head × profile is trained and reported into
  ``OUT/<dataset>-<encoder>-<head>[-<profile>]/``.
- **named runs** (``[[runs]]``): one run folder ``OUT/<name>/`` each, with its own feature file (or dataset ×
  encoder, extracted as a grid cell is), head, profile, methods, seeds, adapter and [train] settings merged
  over the suite's.

Each run folder gets results.json, predictions.npz, heads.safetensors, the tables (table.md / .csv / .tex,
summary.json) and the four plots; finished seeds are kept, as with ``mr2probe train``. Every ``[[compare]]``
writes ``OUT/<name>.md`` / ``.csv`` / ``.png``: the summary across the runs it names (as ``mr2probe report A B
--summary OUT/<name>.md``). ``OUT/summary.md`` / ``.csv`` / ``.png`` gather every finished run. A cell or run
whose data, weights, encoder package or feature file is missing is skipped with one line saying what is
missing; the rest still runs. ``--report-only`` trains and extracts nothing: every run folder of the suite that
has a results.json is reported again from results.json and predictions.npz (tables, plots; no report.html),
then the comparisons and the summary are written again.

Suite schema (unknown keys anywhere are refused; everything is checked when the file is loaded, before any work;
relative paths are relative to the current directory)::

    description = "free text"                        # optional, ignored
    datasets = ["cifar100", "fashion-mnist"]         # the grid: registered names (`mr2probe datasets`);
    encoders = ["extract/clip-vit-b16.toml",         #   recipe files (*.toml; the label is the file stem) or
                "efficientnet-lite0"]                #   registered encoder names (`mr2probe encoders`). Both
                                                     #   required unless the suite has [[runs]]
    methods = "all"                                  # "all" (as `train --methods all`) or a list [ce, mr2]; a
                                                     #   list may hold "all" too: ["all", "logreg", "knn"]
    heads = ["linear", "cosine"]                     # the grid's heads [linear]
    profiles = ["full", "longtail:100", "shots:5"]   # the grid's training-set profiles [full] (`train
                                                     #   --train-profile`; [train] episodes applies to non-full)
    seeds = 3                                        # N (seeds 0..N-1) or a list of seeds [3]
    adapter = "none"                                 # none | linear | mlp [none]

    [roots]                                          # optional: dataset → its folder (wins over --data-root)
    cifar100 = "/data/cifar100"

    [extract]                                        # optional, overrides every recipe: every setting of
    per_class = 5                                    #   `mr2probe.settings.EXTRACT` but the readout (pool,
                                                     #   blocks: the recipe's) under its `extract` flag's name

    [train]                                          # optional: every setting of `mr2probe.settings.TRAIN`
    epochs = 30                                      #   under the name of its `mr2probe train` flag (--min-steps
    lr = [1e-3, 1e-2]                                #   → min_steps; --no-null → null = false), grids as a
    set = { mr2 = { p = 2 } }                        #   number or a list; plus set ({method = {param = value}},
                                                     #   as --set)

    [[runs]]                                         # a named run folder (any number of them)
    name = "linear-longtail100-reach"                # required, unique (grid folders included): OUT/<name>/
    features = "features/mnist-effl0.h5"             # a feature file, or a derived one: "synthetic:K=10,..." /
                                                     #   "spread:PATH,..." (mr2probe/synthetic.py; written once
                                                     #   into --features-dir); or instead of features:
    # dataset = "mnist"                              #   a dataset and an encoder (recipe file or name), extracted
    # encoder = "extract/efficientnet-lite0.toml"    #   as a grid cell is ([extract] and [roots] apply)
    head = "linear"                                  # [linear]
    profile = "longtail:100"                         # [full]
    methods = ["all", "logreg", "knn"]               # [the suite's methods]
    seeds = 3                                        # [the suite's seeds]
    adapter = "none"                                 # [the suite's adapter]
    train = { budget_rule = "reach-logreg" }         # merged over the suite's [train] (same keys and checks; set
                                                     #   is merged method by method)

    [[compare]]                                      # a comparison of runs (any number of them)
    name = "reach-vs-floor-longtail100"              # required, unique: writes OUT/<name>.md, .csv and .png
    runs = ["linear-longtail100", "linear-longtail100-reach"]   # run folders of this suite ([[runs]] or grid)

Dataset folders: ``[roots]``, else ``DATA_ROOT/<dataset>`` when that folder exists, else the dataset's own
default places (e.g. ``/usr/share/datasets/fashion-mnist``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .atomic import atomic_text
from .distributed import rank_world
from .errors import UserError
from .recipes import read_toml
from .settings import EXTRACT, READOUT, check_table

if TYPE_CHECKING:
    from .experiment import ExperimentConfig
    from .summary import Summary

TOP_KEYS = {"description", "datasets", "encoders", "methods", "heads", "seeds", "adapter", "roots", "extract",
            "train", "profiles", "runs", "compare"}
EXTRACT_KEYS = {n: s for n, s in EXTRACT.items() if n not in READOUT}  # [extract]: the readout is the recipe's
RUN_KEYS = {"name": str, "features": str, "dataset": str, "encoder": str, "head": str, "profile": str,
            "methods": object, "seeds": object, "adapter": str, "train": dict}
COMPARE_KEYS = {"name": str, "runs": list}
DERIVED = ("synthetic:", "spread:")  # feature specs made by mr2probe.synthetic.materialize
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=-]*")  # a run or comparison name: one plain file name


@dataclass
class EncoderEntry:
    """One encoder of a suite: its label (file stem / sanitized name) and extraction settings."""

    label: str
    settings: dict[str, Any]  # ExtractConfig fields: encoder, batch_size, ...


@dataclass
class RunEntry:
    """One run folder of a suite, a grid cell × head × profile or a ``[[runs]]`` entry, with its settings
    resolved: ``train`` is the suite's [train] with the run's own merged over it."""

    name: str
    head: str
    profile: str
    methods: list[str]
    seeds: list[int]
    adapter: str
    train: dict[str, Any]
    features: str | None = None  # a feature file or a derived spec; else dataset × encoder
    dataset: str | None = None
    encoder: EncoderEntry | None = None
    grid: bool = False  # a cell of the datasets × encoders × heads × profiles grid

    @property
    def derived(self) -> bool:
        return self.features is not None and self.features.startswith(DERIVED)

    @property
    def source(self) -> str:
        """What the run's features come from, as the log says it: ``dataset × encoder`` or the file / spec."""
        return f"{self.dataset} × {self.encoder.label}" if self.encoder is not None else str(self.features)

    @property
    def title(self) -> str:
        """How the log names the run: the grid's ``dataset × encoder × head[ · profile]``, else its name."""
        if not self.grid:
            return self.name
        return f"{self.source} × {self.head}" + ("" if self.profile == "full" else f" · {self.profile}")


@dataclass
class Compare:
    """A ``[[compare]]``: the summary across the named runs, written to ``OUT/<name>.md`` (+ .csv, .png)."""

    name: str
    runs: list[str]


@dataclass
class Suite:
    """A checked suite file."""

    path: Path
    datasets: list[str]
    encoders: list[EncoderEntry]
    methods: list[str]
    heads: list[str]
    seeds: list[int]
    adapter: str = "none"
    roots: dict[str, Path] = field(default_factory=dict)
    extract: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    skipped_methods: list[str] = field(default_factory=list)  # left out of "all": need an adapter
    profiles: list[str] = field(default_factory=lambda: ["full"])  # training-set profiles (a cell axis)
    runs: list[RunEntry] = field(default_factory=list)  # the [[runs]] entries
    compares: list[Compare] = field(default_factory=list)  # the [[compare]] entries

    @property
    def name(self) -> str:
        return self.path.stem

    def grid(self) -> list[RunEntry]:
        """The run folders of the datasets × encoders × heads × profiles grid, in that order."""
        from .profiles import parse_profile

        entries = []
        for dataset in self.datasets:
            for enc in self.encoders:
                for head in self.heads:
                    for profile in self.profiles:
                        tag = "" if profile == "full" else "-" + parse_profile(profile).text.replace(":", "")
                        entries.append(RunEntry(f"{dataset}-{enc.label}-{head}{tag}", head, profile,
                                                list(self.methods), list(self.seeds), self.adapter, dict(self.train),
                                                dataset=dataset, encoder=enc, grid=True))
        return entries

    def entries(self) -> list[RunEntry]:
        """Every run folder of the suite: the grid's, then the [[runs]] in file order."""
        return self.grid() + list(self.runs)


@dataclass
class CellResult:
    """What happened to one run (``head`` is None for a cell or feature source skipped before training)."""

    dataset: str
    encoder: str
    head: str | None
    status: str  # "done" | "skipped" | "failed"
    message: str = ""
    run_dir: Path | None = None
    summary: Summary | None = None  # the table of a done run
    name: str = ""  # a [[runs]] entry's name (or the names of the runs a skipped feature source had)

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        return f"{self.dataset} × {self.encoder}{f' × {self.head}' if self.head else ''}"


def _type_ok(value: Any, typ: Any) -> bool:
    """A value of the [extract] / [roots] / top-level schema's type (bools are not numbers)."""
    if typ is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, typ)


def _table(where: str, data: Any, schema: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise UserError(f"{where} must be a table")
    unknown = sorted(set(data) - set(schema))
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(schema))}")
    for key, typ in schema.items():
        if key in data and not _type_ok(data[key], typ):
            raise UserError(f"{where}: {key} has the wrong type ({data[key]!r})")
    return dict(data)


def _train_table(where: str, data: Any) -> dict[str, Any]:
    """[train]: the settings of :data:`~mr2probe.settings.TRAIN` by their names, plus ``set``."""
    if not isinstance(data, dict):
        raise UserError(f"{where} must be a table")
    train = check_table(data, where, extra={"set": dict})
    if not all(isinstance(v, dict) for v in train.get("set", {}).values()):
        raise UserError(f"{where}: set takes {{method = {{param = value}}}}")
    return train


def _merge_train(base: dict[str, Any], own: dict[str, Any], methods: list[str]) -> dict[str, Any]:
    """A run's [train]: its own values over the suite's; ``set`` merged method by method, the suite's only for the
    run's ``methods`` (a run's own ``set`` for a method it does not train is refused, as ``--set`` is)."""
    merged = {**base, **own}
    if "set" in base or "set" in own:
        bs = {m: p for m, p in base.get("set", {}).items() if m in methods}
        os_ = own.get("set", {})
        merged["set"] = {m: {**bs.get(m, {}), **os_.get(m, {})} for m in dict.fromkeys([*bs, *os_])}
    return merged


def _names(where: str, value: Any) -> list[str]:
    if not (isinstance(value, list) and value and all(isinstance(v, str) and v.strip() for v in value)):
        raise UserError(f"{where} must be a non-empty list of names, got {value!r}")
    return [v.strip() for v in value]


def _seeds(where: str, seeds: Any) -> list[int]:
    if _type_ok(seeds, int) and seeds >= 1:
        return list(range(seeds))
    if not (isinstance(seeds, list) and seeds and all(_type_ok(s, int) for s in seeds)):
        raise UserError(f"{where}: seeds must be a count ≥ 1 or a list of integers, got {seeds!r}")
    return list(seeds)


def _methods(where: str, spec: Any, adapter: str) -> tuple[list[str], list[str]]:
    """A methods value ("all" or a list of names, "all" among them) → (names, those "all" left out)."""
    from .methods import METHODS, resolve_methods
    from .probes import REFERENCE_PROBES

    if spec != "all":
        spec = _names(f"{where}: methods", spec)
    methods, skipped = resolve_methods(spec, adapter)
    for m in methods:
        if m not in REFERENCE_PROBES:
            METHODS.get(m)
    return methods, skipped


def _adapter(where: str, adapter: Any) -> str:
    from .heads import ADAPTERS

    if not isinstance(adapter, str):
        raise UserError(f"{where}: adapter must be a string")
    ADAPTERS.get(adapter)
    return adapter


def _run_name(where: str, name: Any) -> str:
    if not (isinstance(name, str) and NAME.fullmatch(name)):
        raise UserError(f"{where}: name must be a plain folder name (letters, digits, . _ + = -), got {name!r}")
    return name


def suite_path(text: str, base: Path) -> Path:
    """A path named in a suite: a relative one is read from the suite file's folder ``base`` when the file is
    there, else from the current folder as written (the shipped suites name ``extract/*.toml`` and
    ``features/*.h5`` from the repository root; a feature file still to be made keeps that name)."""
    path = Path(text).expanduser()
    beside = base / path
    return beside if not path.is_absolute() and beside.exists() else path


def _encoder_entry(text: str, where: str, base: Path = Path(".")) -> EncoderEntry:
    from .encoders import ENCODERS
    from .recipes import load_recipe

    if text.endswith(".toml"):
        return EncoderEntry(Path(text).stem, load_recipe(suite_path(text, base)))
    if text not in ENCODERS:
        raise UserError(f"{where}: {text!r} is neither a recipe file (*.toml) nor an encoder; known encoders: "
                        f"{', '.join(ENCODERS.names())}")
    return EncoderEntry(text.replace(":", "_").replace("/", "_"), {"encoder": text})


def _run_entry(where: str, data: Any, methods_spec: Any, seeds: list[int], adapter: str,
               train: dict[str, Any], base: Path = Path(".")) -> RunEntry:
    """One ``[[runs]]`` table, checked, with the suite's values where it has none."""
    from .datasets import DATASETS
    from .heads import HEADS
    from .profiles import parse_profile

    if not isinstance(data, dict):
        raise UserError(f"{where} must be a table")
    where = f"{where} {data['name']!r}" if isinstance(data.get("name"), str) else where
    run = _table(where, data, RUN_KEYS)
    if "name" not in run:
        raise UserError(f"{where} has no name")
    name = _run_name(where, run["name"])
    has_file, has_cell = "features" in run, ("dataset" in run or "encoder" in run)
    if has_file == has_cell or (has_cell and not ("dataset" in run and "encoder" in run)):
        raise UserError(f"{where}: give either features = \"FILE\" (or a synthetic: / spread: spec) or both "
                        "dataset and encoder")
    features = dataset = encoder = None
    if has_file:
        features = run["features"].strip()
        if not features:
            raise UserError(f"{where}: features is empty")
        if ":" not in features.split("/")[0]:  # a file, not a synthetic: / spread: spec
            features = str(suite_path(features, base))
    else:
        dataset = run["dataset"].strip()
        DATASETS.get(dataset)
        encoder = _encoder_entry(run["encoder"].strip(), f"{where}: encoder", base)
    adapter = _adapter(where, run.get("adapter", adapter))
    methods, _ = _methods(where, run.get("methods", methods_spec), adapter)
    head = run.get("head", "linear")
    HEADS.get(head)
    profile = parse_profile(run.get("profile", "full")).text
    own = _train_table(f"{where} train", run.get("train", {}))
    return RunEntry(name, head, profile, methods, _seeds(where, run["seeds"]) if "seeds" in run else list(seeds),
                    adapter, _merge_train(train, own, methods), features, dataset, encoder)


def _compare(where: str, data: Any) -> Compare:
    if not isinstance(data, dict):
        raise UserError(f"{where} must be a table")
    where = f"{where} {data['name']!r}" if isinstance(data.get("name"), str) else where
    entry = _table(where, data, COMPARE_KEYS)
    if "name" not in entry or "runs" not in entry:
        raise UserError(f"{where} needs a name and runs")
    name = _run_name(where, entry["name"])
    if name == "summary":
        raise UserError(f"{where}: the name summary is the suite's own summary.md; choose another")
    runs = _names(f"{where}: runs", entry["runs"])
    if len(set(runs)) < len(runs):
        raise UserError(f"{where}: a run is listed twice")
    return Compare(name, runs)


def _tables(where: str, value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise UserError(f"{where} must be an array of tables ([[...]])")
    return value


def load_suite(path: str | Path) -> Suite:
    """Parse and check a suite file (every name, key and type; see the module docstring)."""
    from .datasets import DATASETS
    from .heads import HEADS

    path = Path(path)
    data = read_toml(path, "suite", "benchmarks/")
    where = f"suite {path}"
    _table(where, data, {k: object for k in TOP_KEYS})
    has_runs = bool(data.get("runs"))
    for key in ("datasets", "encoders"):
        if key not in data and (not has_runs or "datasets" in data or "encoders" in data):
            raise UserError(f"{where} has no {key!r} list" + ("" if has_runs else " (and no [[runs]])"))
    datasets = _names(f"{where}: datasets", data["datasets"]) if "datasets" in data else []
    for d in datasets:
        DATASETS.get(d)
    encoders = ([_encoder_entry(e, f"{where}: encoders", path.parent)
                 for e in _names(f"{where}: encoders", data["encoders"])] if "encoders" in data else [])
    labels = [e.label for e in encoders]
    if len(set(labels)) < len(labels) or len(set(datasets)) < len(datasets):
        raise UserError(f"{where}: a dataset or encoder is listed twice")
    adapter = _adapter(where, data.get("adapter", "none"))
    methods_spec = data.get("methods", ["ce", "mr2"])
    methods, skipped = _methods(where, methods_spec, adapter)
    heads = _names(f"{where}: heads", data.get("heads", ["linear"]))
    for h in heads:
        HEADS.get(h)
    seeds = _seeds(where, data.get("seeds", 3))
    train = _train_table(f"{where} [train]", data.get("train", {}))
    runs = [_run_entry(f"{where} [[runs]]", r, methods_spec, seeds, adapter, train, path.parent)
            for r in _tables(f"{where}: runs", data.get("runs", []))]
    compares = [_compare(f"{where} [[compare]]", c) for c in _tables(f"{where}: compare", data.get("compare", []))]
    run_datasets = [r.dataset for r in runs if r.dataset]
    roots = _table(f"{where} [roots]", data.get("roots", {}), {d: str for d in [*datasets, *run_datasets]})
    suite = Suite(path, datasets, encoders, methods, heads, seeds, adapter, {d: Path(r) for d, r in roots.items()},
                  _extract_table(f"{where} [extract]", data.get("extract", {})), train, skipped,
                  _names(f"{where}: profiles", data.get("profiles", ["full"])), runs, compares)
    entries = suite.entries()
    seen: set[str] = set()
    for entry in entries:  # every setting checked now, not after hours of extraction
        if entry.name in seen:
            raise UserError(f"{where}: two runs are named {entry.name!r} (run names are folder names under --out; "
                            "a grid run is named <dataset>-<encoder>-<head>[-<profile>])")
        seen.add(entry.name)
        try:
            entry_config(entry, Path("features.h5"), Path("out")).check()
        except UserError as e:
            if entry.grid:
                raise
            raise UserError(f"{where} [[runs]] {entry.name!r}: {e}") from None
    trained = {m for e in entries for m in e.methods}
    stray = sorted(set(train.get("set", {})) - trained)
    if stray:  # a typo'd method would otherwise make the [train] set silently do nothing
        raise UserError(f"{where} [train]: set names {', '.join(stray)}, which no run of the suite trains")
    names = [c.name for c in compares]
    if len(set(names)) < len(names):
        raise UserError(f"{where}: two [[compare]] entries are named alike")
    for c in compares:
        unknown = [r for r in c.runs if r not in seen]
        if unknown:
            raise UserError(f"{where} [[compare]] {c.name!r}: no run named {', '.join(unknown)} in this suite")
    return suite


def _extract_table(where: str, data: Any) -> dict[str, Any]:
    """[extract]: the settings of :data:`EXTRACT_KEYS` by their names, each checked as its setting declares (so a
    value ``extract`` would refuse is refused when the suite is loaded, not when the cell is reached)."""
    if not isinstance(data, dict):
        raise UserError(f"{where} must be a table")
    return check_table(data, where, table=EXTRACT_KEYS)


def entry_config(entry: RunEntry, features: Path, out: Path, progress: bool = True) -> ExperimentConfig:
    """The ``ExperimentConfig`` of one run of a suite (its [train] settings; ``episodes`` applies to the profiles
    other than ``full``; the report's settings, :data:`~mr2probe.settings.REPORT`, are not part of it)."""
    from .experiment import config_from_settings
    from .settings import split_report

    values = split_report({k: v for k, v in entry.train.items() if k != "set"})[1]
    if entry.profile.strip() == "full":
        values.pop("episodes", None)
    return config_from_settings(features, out, list(entry.methods), list(entry.seeds), entry.head, entry.adapter,
                                values, entry.train.get("set", {}), entry.profile, progress)


def experiment_config(suite: Suite, head: str, features: Path, out: Path, progress: bool = True,
                      profile: str = "full") -> ExperimentConfig:
    """The ``ExperimentConfig`` of one head × training profile of one grid cell (the suite's [train] settings)."""
    return entry_config(RunEntry("", head, profile, list(suite.methods), list(suite.seeds), suite.adapter,
                                 dict(suite.train)), features, out, progress)


def dataset_root(suite: Suite, dataset: str, data_root: Path | None) -> Path | None:
    """``[roots]``, else ``data_root/<dataset>`` if it exists, else None (the dataset's default places)."""
    if dataset in suite.roots:
        return suite.roots[dataset]
    if data_root is not None and (Path(data_root) / dataset).is_dir():
        return Path(data_root) / dataset
    return None


def features_path(suite: Suite, dataset: str, enc: EncoderEntry, features_dir: Path) -> Path:
    per_class = suite.extract.get("per_class", enc.settings.get("per_class"))
    return Path(features_dir) / f"{dataset}-{enc.label}{f'-pc{per_class}' if per_class else ''}.h5"


def cached(path: Path) -> bool:
    """A finished, valid feature file is there."""
    from .featurestore import read_features

    if not path.is_file():
        return False
    try:
        read_features(path, load=False)
        return True
    except UserError:
        return False  # damaged: extract() says so (and how to recompute it)


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def extract_cell(suite: Suite, dataset: str, enc: EncoderEntry, feats: Path, data_root: Path | None,
                 progress: bool = True) -> str:
    """Extract one cell's features into ``feats``; "" when done, else one line saying what is missing.

    The dataset is opened first on its own (it is opened again by the extraction: a folder scan or a label
    read, small next to encoding it) so that a missing dataset and a missing encoder are told apart."""
    from .datasets import build_dataset
    from .extract import ExtractConfig, extract

    root = dataset_root(suite, dataset, data_root)
    try:
        build_dataset(dataset, root)
    except (UserError, ImportError) as e:
        hint = ""
        if root is None:
            hint = (f" (no folder {Path(data_root) / dataset})" if data_root is not None else
                    f" (set [roots] {dataset} = \"DIR\" in the suite, or --data-root DIR with DIR/{dataset})")
        return f"missing data: {_first_line(e)}{hint}"
    try:
        extract(ExtractConfig(dataset=dataset, out=feats, root=root, progress=progress,
                              **{**enc.settings, **suite.extract}))
    except (UserError, ImportError) as e:
        return f"cannot extract (encoder, weights or feature file): {_first_line(e)}"
    return ""


def _source_key(suite: Suite, entry: RunEntry, features_dir: Path) -> str:
    """Runs with the same key share one feature file (extracted, derived or checked once)."""
    if entry.encoder is not None:
        return str(features_path(suite, entry.dataset, entry.encoder, features_dir))
    return str(entry.features)


def prepare_features(suite: Suite, entry: RunEntry, features_dir: Path, data_root: Path | None,
                     progress: bool = True, log: Callable[[str], None] = print) -> tuple[Path | None, str]:
    """The feature file of ``entry``: extracted (dataset × encoder), derived (``synthetic:`` / ``spread:``, by
    :func:`mr2probe.synthetic.materialize`) or given; (path, "") when it is there, else (None, one line saying
    what is missing)."""
    if entry.encoder is not None:
        feats = features_path(suite, entry.dataset, entry.encoder, features_dir)
        if cached(feats):
            log(f"{entry.source}: features cached in {feats}")
            return feats, ""
        why = extract_cell(suite, entry.dataset, entry.encoder, feats, data_root, progress)
        return (None, why) if why else (feats, "")
    if entry.derived:
        try:
            from .synthetic import materialize

            return Path(materialize(entry.features, Path(features_dir))), ""
        except (UserError, ImportError) as e:
            return None, f"cannot derive the features: {_first_line(e)}"
    feats = Path(entry.features)
    if not feats.is_file():
        return None, f"missing features: no file {feats} (extract or import it first, see the suite's header)"
    return feats, ""


def run_suite(suite: Suite, data_root: Path | None = None, features_dir: Path = Path("features"),
              out: Path | None = None, progress: bool = True, log: Callable[[str], None] = print,
              report_only: bool = False) -> list[CellResult]:
    """Run every run of ``suite`` (the grid's, then the [[runs]]); write each run folder, every [[compare]] and
    ``out/summary.md``; return what happened to each run. ``report_only``: no extraction or training — every run
    folder that has a results.json is reported again with the current protocol (tables and plots, no
    report.html), then the comparisons and summary.md; the others are listed as skipped."""
    from .experiment import run_experiment
    from .report import report_run
    from .settings import split_report
    from .tracking import check_spec, tracked

    out = Path(out) if out is not None else Path("runs") / suite.name
    if suite.skipped_methods:
        log(f"methods all: skipping {', '.join(suite.skipped_methods)} (needs adapter = \"linear\" or \"mlp\")")
    entries = suite.entries()
    for spec in dict.fromkeys(() if report_only else (e.train.get("log", "") for e in entries)):
        check_spec(spec)  # [train] log: a bad spec or a missing library stops the suite before any run
    keys = {e.name: _source_key(suite, e, features_dir) for e in entries}
    results: list[CellResult] = []
    prepared: dict[str, tuple[Path | None, str]] = {}
    for entry in entries:
        run_dir = out / entry.name
        head = entry.head if entry.profile == "full" else f"{entry.head} · {entry.profile}"
        name = "" if entry.grid else entry.name
        dataset, encoder = entry.dataset or "", entry.encoder.label if entry.encoder else ""
        feats = None
        if report_only:
            if not (run_dir / "results.json").is_file():
                log(f"skip {entry.title}: --report-only and no {run_dir}/results.json")
                results.append(CellResult(dataset, encoder, head, "skipped", "not trained yet", run_dir, None, name))
                continue
        else:
            key = keys[entry.name]
            if key not in prepared:
                prepared[key] = prepare_features(suite, entry, features_dir, data_root, progress, log)
                feats, why = prepared[key]
                if why:
                    sharing = [e for e in entries if keys[e.name] == key]
                    named = ", ".join(e.name for e in sharing if not e.grid)
                    if any(e.grid for e in sharing):  # a grid cell: one line for the cell, as before [[runs]]
                        line = why + (f" (and run(s) {named})" if named else "")
                        log(f"skip {entry.source}: {line}")
                        results.append(CellResult(dataset, encoder, None, "skipped", line))
                    else:
                        log(f"skip run(s) {named}: {why}")
                        results.append(CellResult(dataset, encoder, None, "skipped", why, None, None, named))
            feats, why = prepared[key]
            if why:
                continue
        try:
            cfg = None if report_only else entry_config(entry, feats, run_dir, progress)
            with tracked(cfg, entry.name, out.name) as tracker:  # [train] log: the run's experiment tracker
                if cfg is not None:
                    run_experiment(cfg, on_epoch=tracker.epoch)
                if rank_world()[0] != 0:
                    continue  # under torchrun rank 0 reports and writes summary.md
                # tables and the four PNGs, as `mr2probe report`; its summary has the bootstrap CIs
                report = split_report(entry.train)[0]
                summary = report_run(run_dir, report["groups_on"], plots=True,
                                     margin=report["equivalence_margin"]).summary
                tracker.final(summary, run_dir)
        except UserError as e:
            log(f"failed {entry.title}: {e}")
            results.append(CellResult(dataset, encoder, head, "failed", str(e), run_dir, None, name))
            continue
        log(f"{entry.title}: wrote {run_dir}")
        results.append(CellResult(dataset, encoder, head, "done", "", run_dir, summary, name))
    if rank_world()[0] != 0:
        return results
    write_compares(suite, results, out, log)
    path = write_summary(suite, results, out, plots=True)
    log(f"wrote {path}")
    return results


def write_compares(suite: Suite, results: list[CellResult], out: Path, log: Callable[[str], None]) -> None:
    """Every [[compare]] of ``suite`` whose runs are all done (:func:`write_compare`); the others skipped with a
    line."""
    done = {r.run_dir.name: r for r in results if r.status == "done"}
    for c in suite.compares:
        missing = [r for r in c.runs if r not in done]
        if missing:
            log(f"skip compare {c.name}: run(s) {', '.join(missing)} not done")
            continue
        for path in write_compare(out, c.name, [(r, done[r].summary) for r in c.runs]):
            log(f"wrote {path}")


def write_compare(out: Path, name: str, items: list[tuple[str, Summary]], plots: bool = True) -> list[Path]:
    """``out/NAME.md`` + ``.csv`` (+ ``.png``, the forest plot of ΔHard): the summary across the runs ``items``
    (label → summary), the same files as ``mr2probe report RUN... --summary out/NAME.md``."""
    from .report import cross_run_markdown, cross_run_summary, to_csv_numbers

    cross = cross_run_summary(items)
    md, csv = out / f"{name}.md", out / f"{name}.csv"
    atomic_text(md, cross_run_markdown(cross))
    atomic_text(csv, to_csv_numbers(cross.numbers))
    written = [md, csv]
    if plots:
        from .plots import plot_across_runs

        png, _ = plot_across_runs(cross.numbers[cross.numbers["scope"] == "run"], md.with_suffix(".png"))
        written.append(png)
    return written


def write_summary(suite: Suite, results: list[CellResult], out: Path, plots: bool = False) -> Path:
    """``out/summary.md``: what ran, then the summary across the finished runs (:func:`~mr2probe.report.
    cross_run_summary`, the same as ``mr2probe report``'s: per run and method the protocol's main columns, the
    instruments and the ΔHard CI; the minimum detectable ΔHard per run; per method the mean Δs over runs and how
    many runs have a ΔHard CI above / below 0; the hard-set stability across runs of the same dataset), then the
    skipped and failed runs. ``out/summary.csv`` holds the numbers; with ``plots``, ``out/summary.png`` the
    forest plot of every run's ΔHard."""
    from .report import cross_run_markdown, cross_run_summary, to_csv_numbers

    done = [r for r in results if r.status == "done"]
    if suite.runs:
        settings = "methods, seeds, head, profile and settings per run (each run's table.md says them)"
    else:
        settings = f"methods: {', '.join(suite.methods)}; seeds {suite.seeds}; adapter {suite.adapter}"
    lines = [f"# Benchmark suite `{suite.name}`", "",
             f"{len(done)} run(s) done, {sum(r.status == 'skipped' for r in results)} cell(s) skipped, "
             f"{sum(r.status == 'failed' for r in results)} run(s) failed. {settings[0].upper()}{settings[1:]}; "
             f"groups ranked on {suite.train.get('groups_on', 'val')} of the reference.", ""]
    out.mkdir(parents=True, exist_ok=True)
    if done:
        cross = cross_run_summary([(r.run_dir.name, r.summary) for r in done])
        lines.append(cross_run_markdown(cross, {r.run_dir.name: f"[{r.run_dir.name}]({r.run_dir.name}/table.md)"
                                                for r in done}))
        atomic_text(out / "summary.csv", to_csv_numbers(cross.numbers))
        if plots:
            from .plots import plot_across_runs

            plot_across_runs(cross.numbers[cross.numbers["scope"] == "run"], out / "summary.png")
    for status, title in (("skipped", "Skipped cells"), ("failed", "Failed runs")):
        rows = [r for r in results if r.status == status]
        if rows:
            lines += ["", f"## {title}", ""]
            lines += [f"- {r.label}: {r.message}" for r in rows]
    path = out / "summary.md"
    atomic_text(path, "\n".join(lines) + "\n")
    return path


__all__ = ["Suite", "RunEntry", "Compare", "CellResult", "load_suite", "run_suite", "write_summary",
           "write_compare", "entry_config"]
