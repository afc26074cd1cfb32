"""Benchmark suites: one TOML file → extract → train → report for every dataset × encoder × head, + a summary.

``mr2probe bench SUITE.toml [--data-root DIR] [--features-dir DIR] [--out DIR]``. For every *cell*
(dataset × encoder) the features are extracted into ``FEATURES_DIR/<dataset>-<encoder>[-pc<N>].h5`` (a
finished file there is kept, not recomputed; an interrupted one is resumed), then for every head the methods ×
seeds are trained and reported into ``OUT/<dataset>-<encoder>-<head>/`` (results.json, table.md, ...; finished
seeds are kept, as with ``mr2probe train``), and ``OUT/summary.md`` gathers all cells. A cell whose data,
weights or encoder package are missing is skipped with one line saying what is missing; the rest still runs.

Suite schema (unknown keys anywhere are refused; relative paths are relative to the current directory)::

    description = "free text"                        # optional, ignored
    datasets = ["cifar100", "fashion-mnist"]         # required: registered names (`mr2probe datasets`)
    encoders = ["extract/clip-vit-b16.toml",         # required: recipe files (*.toml; the label is the file
                "efficientnet-lite0"]                #   stem) or registered encoder names (`mr2probe encoders`)
    methods = "all"                                  # "all" (as `train --methods all`) or a list [ce, mr2]
    heads = ["linear", "cosine"]                     # [linear]
    profiles = ["full", "longtail:100", "shots:5"]   # training-set profiles, a cell axis [full] (`train
                                                     #   --train-profile`; [train] episodes applies to non-full)
    seeds = 3                                        # N (seeds 0..N-1) or a list of seeds [3]
    adapter = "none"                                 # none | linear | mlp [none]

    [roots]                                          # optional: dataset → its folder (wins over --data-root)
    cifar100 = "/data/cifar100"

    [extract]                                        # optional, overrides every recipe: per_class, batch_size,
    per_class = 5                                    #   workers, dtype, amp, runtime, device

    [train]                                          # optional: every setting of `mr2probe.settings.TRAIN`
    epochs = 30                                      #   under the name of its `mr2probe train` flag (--min-steps
    lr = [1e-3, 1e-2]                                #   → min_steps; --no-null → null = false), grids as a
    set = { mr2 = { p = 2 } }                        #   number or a list; plus set ({method = {param = value}},
                                                     #   as --set)

Dataset folders: ``[roots]``, else ``DATA_ROOT/<dataset>`` when that folder exists, else the dataset's own
default places (e.g. ``/usr/share/datasets/fashion-mnist``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .atomic import atomic_text
from .distributed import rank_world
from .errors import UserError
from .recipes import read_toml

if TYPE_CHECKING:
    from .experiment import ExperimentConfig
    from .summary import Summary

TOP_KEYS = {"description", "datasets", "encoders", "methods", "heads", "seeds", "adapter", "roots", "extract",
            "train", "profiles"}
EXTRACT_KEYS = {"per_class": int, "batch_size": int, "workers": int, "dtype": str, "amp": str, "runtime": str,
                "device": str}


@dataclass
class EncoderEntry:
    """One encoder of a suite: its label (file stem / sanitized name) and extraction settings."""

    label: str
    settings: dict[str, Any]  # ExtractConfig fields: encoder, batch_size, ...


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

    @property
    def name(self) -> str:
        return self.path.stem


@dataclass
class CellResult:
    """What happened to one dataset × encoder × head (``head`` is None for a cell skipped before training)."""

    dataset: str
    encoder: str
    head: str | None
    status: str  # "done" | "skipped" | "failed"
    message: str = ""
    run_dir: Path | None = None
    summary: Summary | None = None  # the table of a done run


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
    from .settings import check_table

    if not isinstance(data, dict):
        raise UserError(f"{where} must be a table")
    return check_table(data, where, extra={"set": dict})


def _names(where: str, value: Any) -> list[str]:
    if not (isinstance(value, list) and value and all(isinstance(v, str) and v.strip() for v in value)):
        raise UserError(f"{where} must be a non-empty list of names, got {value!r}")
    return [v.strip() for v in value]


def _encoder_entry(text: str, where: str) -> EncoderEntry:
    from .encoders import ENCODERS
    from .recipes import load_recipe

    if text.endswith(".toml"):
        return EncoderEntry(Path(text).stem, load_recipe(text))
    if text not in ENCODERS:
        raise UserError(f"{where}: {text!r} is neither a recipe file (*.toml) nor an encoder; known encoders: "
                        f"{', '.join(ENCODERS.names())}")
    return EncoderEntry(text.replace(":", "_").replace("/", "_"), {"encoder": text})


def load_suite(path: str | Path) -> Suite:
    """Parse and check a suite file (every name, key and type; see the module docstring)."""
    from .methods import resolve_methods
    from .datasets import DATASETS
    from .heads import ADAPTERS, HEADS
    from .methods import METHODS

    path = Path(path)
    data = read_toml(path, "suite", "benchmarks/")
    where = f"suite {path}"
    _table(where, data, {k: object for k in TOP_KEYS})
    for key in ("datasets", "encoders"):
        if key not in data:
            raise UserError(f"{where} has no {key!r} list")
    datasets = _names(f"{where}: datasets", data["datasets"])
    for d in datasets:
        DATASETS.get(d)
    encoders = [_encoder_entry(e, f"{where}: encoders") for e in _names(f"{where}: encoders", data["encoders"])]
    labels = [e.label for e in encoders]
    if len(set(labels)) < len(labels) or len(set(datasets)) < len(datasets):
        raise UserError(f"{where}: a dataset or encoder is listed twice")
    adapter = data.get("adapter", "none")
    if not isinstance(adapter, str):
        raise UserError(f"{where}: adapter must be a string")
    ADAPTERS.get(adapter)
    methods_spec = data.get("methods", ["ce", "mr2"])
    if methods_spec != "all":
        methods_spec = _names(f"{where}: methods", methods_spec)
    methods, skipped = resolve_methods(methods_spec, adapter)
    from .probes import REFERENCE_PROBES

    for m in methods:
        if m not in REFERENCE_PROBES:
            METHODS.get(m)
    heads = _names(f"{where}: heads", data.get("heads", ["linear"]))
    for h in heads:
        HEADS.get(h)
    seeds = data.get("seeds", 3)
    if _type_ok(seeds, int) and seeds >= 1:
        seeds = list(range(seeds))
    elif not (isinstance(seeds, list) and seeds and all(_type_ok(s, int) for s in seeds)):
        raise UserError(f"{where}: seeds must be a count ≥ 1 or a list of integers, got {seeds!r}")
    roots = _table(f"{where} [roots]", data.get("roots", {}), {d: str for d in datasets})
    suite = Suite(path, datasets, encoders, methods, heads, list(seeds), adapter,
                  {d: Path(r) for d, r in roots.items()}, _table(f"{where} [extract]", data.get("extract", {}),
                                                                  EXTRACT_KEYS),
                  _train_table(f"{where} [train]", data.get("train", {})), skipped,
                  _names(f"{where}: profiles", data.get("profiles", ["full"])))
    _check_extract(suite)  # [train] values (groups_on among them) were checked against their settings above
    for head in heads:  # every setting checked now, not after hours of extraction
        for profile in suite.profiles:
            experiment_config(suite, head, Path("features.h5"), Path("out"), profile=profile).check()
    return suite


def _check_extract(suite: Suite) -> None:
    """The [extract] values that ``extract`` would refuse only when it reaches the cell."""
    from .extract import AMP_DTYPES

    allowed = {"dtype": ("float16", "float32"), "amp": tuple(AMP_DTYPES), "runtime": ("auto", "torch", "onnx")}
    for key, value in suite.extract.items():
        if key in ("per_class", "batch_size") and value < 1:
            raise UserError(f"suite {suite.path} [extract]: {key} must be ≥ 1, got {value}")
        if key in allowed and value not in allowed[key]:
            raise UserError(f"suite {suite.path} [extract]: {key} must be one of {', '.join(allowed[key])}, "
                            f"got {value!r}")


def experiment_config(suite: Suite, head: str, features: Path, out: Path, progress: bool = True,
                      profile: str = "full") -> ExperimentConfig:
    """The ``ExperimentConfig`` of one head × training profile of one cell (the suite's [train] settings;
    ``episodes`` applies to the profiles other than ``full``)."""
    from .experiment import config_from_settings

    values = {k: v for k, v in suite.train.items() if k not in ("set", "groups_on")}
    if profile.strip() == "full":
        values.pop("episodes", None)
    set_ = suite.train.get("set", {})
    if not all(isinstance(v, dict) for v in set_.values()):
        raise UserError(f"suite {suite.path} [train]: set takes {{method = {{param = value}}}}")
    return config_from_settings(features, out, list(suite.methods), list(suite.seeds), head, suite.adapter, values,
                                set_, profile, progress)


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


def extract_cell(suite: Suite, dataset: str, enc: EncoderEntry, feats: Path, data_root: Path | None,
                 progress: bool = True) -> str:
    """Extract one cell's features into ``feats``; "" when done, else one line saying what is missing.

    The dataset is opened first on its own (it is opened again by the extraction: a folder scan or a label
    read, small next to encoding it) so that a missing dataset and a missing encoder are told apart."""
    from .datasets import build_dataset
    from .extract import ExtractConfig, extract

    def first_line(e: BaseException) -> str:
        return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__

    root = dataset_root(suite, dataset, data_root)
    try:
        build_dataset(dataset, root)
    except (UserError, ImportError) as e:
        hint = ""
        if root is None:
            hint = (f" (no folder {Path(data_root) / dataset})" if data_root is not None else
                    f" (set [roots] {dataset} = \"DIR\" in the suite, or --data-root DIR with DIR/{dataset})")
        return f"missing data: {first_line(e)}{hint}"
    try:
        extract(ExtractConfig(dataset=dataset, out=feats, root=root, progress=progress,
                              **{**enc.settings, **suite.extract}))
    except (UserError, ImportError) as e:
        return f"cannot extract (encoder, weights or feature file): {first_line(e)}"
    return ""


def run_suite(suite: Suite, data_root: Path | None = None, features_dir: Path = Path("features"),
              out: Path | None = None, progress: bool = True, log: Callable[[str], None] = print,
              report_only: bool = False) -> list[CellResult]:
    """Run every cell of ``suite``; write each run folder and ``out/summary.md``; return what happened.
    ``report_only``: no extraction or training — every run folder that has a results.json is reported again
    with the current protocol (tables, plots, summary.md), the others are listed as skipped."""
    from .experiment import run_experiment
    from .profiles import parse_profile
    from .report import report_run

    out = Path(out) if out is not None else Path("runs") / suite.name
    if suite.skipped_methods:
        log(f"methods all: skipping {', '.join(suite.skipped_methods)} (needs adapter = \"linear\" or \"mlp\")")
    results: list[CellResult] = []
    for dataset in suite.datasets:
        for enc in suite.encoders:
            cell = f"{dataset} × {enc.label}"
            feats = features_path(suite, dataset, enc, features_dir)
            if report_only:
                pass
            elif cached(feats):
                log(f"{cell}: features cached in {feats}")
            else:
                why = extract_cell(suite, dataset, enc, feats, data_root, progress)
                if why:
                    log(f"skip {cell}: {why}")
                    results.append(CellResult(dataset, enc.label, None, "skipped", why))
                    continue
            for head, profile in ((h, p) for h in suite.heads for p in suite.profiles):
                tag = "" if profile == "full" else "-" + parse_profile(profile).text.replace(":", "")
                run_dir = out / f"{dataset}-{enc.label}-{head}{tag}"
                head = head if profile == "full" else f"{head} · {profile}"
                if report_only and not (run_dir / "results.json").is_file():
                    log(f"skip {cell} × {head}: --report-only and no {run_dir}/results.json")
                    results.append(CellResult(dataset, enc.label, head, "skipped", "not trained yet", run_dir))
                    continue
                try:
                    if not report_only:
                        run_experiment(experiment_config(suite, head.split(" · ")[0], feats, run_dir, progress,
                                                         profile))
                    if rank_world()[0] != 0:
                        continue  # under torchrun rank 0 reports and writes summary.md
                    # tables and the four PNGs, as `mr2probe report`; its summary has the bootstrap CIs
                    summary = report_run(run_dir, suite.train.get("groups_on", "val"), plots=True).summary
                except UserError as e:
                    log(f"failed {cell} × {head}: {e}")
                    results.append(CellResult(dataset, enc.label, head, "failed", str(e), run_dir))
                    continue
                log(f"{cell} × {head}: wrote {run_dir}")
                results.append(CellResult(dataset, enc.label, head, "done", "", run_dir, summary))
    if rank_world()[0] != 0:
        return results
    path = write_summary(suite, results, out)
    log(f"wrote {path}")
    return results


def write_summary(suite: Suite, results: list[CellResult], out: Path) -> Path:
    """``out/summary.md``: what ran, then the summary across the finished runs (:func:`~mr2probe.report.
    cross_run_summary`, the same as ``mr2probe report``'s: per run and method the protocol's main columns, the
    instruments and the ΔHard CI; the minimum detectable ΔHard per run; per method the mean Δs over runs and how
    many runs have a ΔHard CI above / below 0; the hard-set stability across runs of the same dataset), then the
    skipped and failed cells. ``out/summary.csv`` holds the numbers."""
    from .report import cross_run_markdown, cross_run_summary, to_csv_numbers

    done = [r for r in results if r.status == "done"]
    lines = [f"# Benchmark suite `{suite.name}`", "",
             f"{len(done)} run(s) done, {sum(r.status == 'skipped' for r in results)} cell(s) skipped, "
             f"{sum(r.status == 'failed' for r in results)} run(s) failed. Methods: {', '.join(suite.methods)}; "
             f"seeds {suite.seeds}; adapter {suite.adapter}; groups ranked on "
             f"{suite.train.get('groups_on', 'val')} of the reference.", ""]
    out.mkdir(parents=True, exist_ok=True)
    if done:
        cross = cross_run_summary([(r.run_dir.name, r.summary) for r in done])
        lines.append(cross_run_markdown(cross, {r.run_dir.name: f"[{r.run_dir.name}]({r.run_dir.name}/table.md)"
                                                for r in done}))
        atomic_text(out / "summary.csv", to_csv_numbers(cross.numbers))
    for status, title in (("skipped", "Skipped cells"), ("failed", "Failed runs")):
        rows = [r for r in results if r.status == status]
        if rows:
            lines += ["", f"## {title}", ""]
            lines += [f"- {r.dataset} × {r.encoder}{f' × {r.head}' if r.head else ''}: {r.message}" for r in rows]
    path = out / "summary.md"
    atomic_text(path, "\n".join(lines) + "\n")
    return path


__all__ = ["Suite", "CellResult", "load_suite", "run_suite", "write_summary"]
