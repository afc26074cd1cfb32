"""The ``mr2probe`` command line: a thin typer layer over functions usable from Python.

Every ``UserError`` becomes one line on stderr and exit code 2; Ctrl-C says how to resume and exits 130.
"""
from __future__ import annotations

import functools
import inspect
import json
import sys
from pathlib import Path
from typing import Callable, Optional

import typer

from .distributed import init_distributed, rank_world
from .errors import UserError
from .settings import EXTRACT, REPORT, TABLE, Setting, parse_floats, split_report

# rich_markup_mode=None: help text is shown as written ("[float16]" is a default, not a markup tag)
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Linear-probe benchmarks of frozen encoders: extract → train (CE, MR2, baselines) → report.")


def fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def guarded(resume_hint: str = "") -> Callable:
    """Run a command body; UserError → one line + exit 2, Ctrl-C → one line + exit 130."""

    def deco(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except UserError as e:
                fail(str(e).replace("\n", " "))
            except KeyboardInterrupt:
                out = kwargs.get("out")
                hint = (resume_hint or "nothing was written").replace("OUT", str(out) if out else "OUT")
                fail(f"interrupted; {hint}", 130)

        return wrapper

    return deco


def with_settings(settings: dict[str, Setting], given_only: bool = False) -> Callable:
    """Give a command one option per setting (flag, default and help from the schema, :mod:`mr2probe.settings`)
    and pass their values to it as ``settings`` ({name: value}, grids as tuples, ``--no-X`` flags as X), each
    checked as its setting declares. ``given_only``: the options default to None and only the flags given are
    passed (their defaults shown in the help), so a recipe's values stand where no flag is given."""

    def option(s: Setting) -> inspect.Parameter:
        if given_only:
            default, annotation = None, Optional[{"int": int, "float": float}.get(s.kind, str)]
            text = s.help + ("" if s.default is None or s.help.endswith("]") else f" [{s.default}]")
            return inspect.Parameter(s.name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                                     default=typer.Option(default, s.flag, help=text))
        if s.kind == "bool":
            default, annotation = False, bool  # --no-X for a default-on setting, --X for a default-off one
        elif s.kind == "floats":
            default, annotation = ",".join(f"{v:g}" for v in s.default), str
        elif s.kind in ("device", "size"):
            default, annotation = s.default, Optional[str]
        else:
            default, annotation = s.default, {"int": int, "float": float, "str": str}[s.kind]
        text = s.help + (" [on by default; this flag turns it off]" if s.kind == "bool" and s.default else "")
        return inspect.Parameter(s.name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                                 default=typer.Option(default, s.flag, help=text))

    def value(s: Setting, given: object) -> object:
        if s.kind == "bool":
            return not given if s.default else bool(given)
        return s.check(parse_floats(str(given), s.flag) if s.kind == "floats" else given, s.flag)

    def deco(fn: Callable) -> Callable:
        own = [p for p in inspect.signature(fn, eval_str=True).parameters.values() if p.name != "settings"]

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            given = {n: kwargs.pop(n) for n in settings}
            if given_only:
                given = {n: v for n, v in given.items() if v is not None}
            return fn(*args, settings={n: value(settings[n], v) for n, v in given.items()}, **kwargs)

        wrapper.__signature__ = inspect.Signature(own + [option(s) for s in settings.values()])
        return wrapper

    return deco


@app.command()
@guarded("rerun the same command to resume: finished rows are kept in OUT.partial")
@with_settings(EXTRACT, given_only=True)
def extract(
    encoder: Optional[str] = typer.Option(None, "--encoder", "-e", help="Encoder name (see `mr2probe encoders`)."),
    dataset: Optional[str] = typer.Option(None, "--dataset", "-d", help="Dataset name (see `mr2probe datasets`)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output feature file (.h5); written as OUT.partial "
                                       "and renamed when complete. Default: features/<dataset>-<encoder>.h5"),
    recipe: Optional[Path] = typer.Option(None, "--recipe", help="TOML recipe (extract/*.toml) with encoder and "
                                          "extraction settings; flags given on the command line win."),
    root: Optional[Path] = typer.Option(None, "--root", help="Folder holding the dataset's files."),
    download: bool = typer.Option(False, "--download", help="Let torchvision datasets download into --root."),
    weights: Optional[Path] = typer.Option(None, "--weights", help="Encoder weights file (state dict, loaded "
                                           "with weights_only=True); its sha256 goes into the file."),
    splits: Optional[str] = typer.Option(None, "--splits", help="Comma-separated splits [train,val,test: those "
                                         "the dataset has]."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Start over instead of resuming / keeping."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    settings: dict = None,  # the options of mr2probe.settings.EXTRACT (--batch-size, --dtype, --pool, ...)
) -> None:
    """Run a frozen encoder over a dataset and cache features + labels + provenance in HDF5 (resumable;
    under `torchrun --nproc_per_node=N -m mr2probe extract ...` each split is sharded over N processes)."""
    from .extract import ExtractConfig, default_out, extract as run_extract
    from .recipes import load_recipe

    settings = {**(load_recipe(recipe) if recipe else {}), **settings}  # the flags given win over the recipe
    if encoder is not None:
        settings["encoder"] = encoder
    if not settings.get("encoder"):
        raise UserError("--encoder (or --recipe) is required; see `mr2probe encoders`")
    if not dataset:
        raise UserError("--dataset is required; see `mr2probe datasets`")
    if out is None:
        out = default_out(dataset, settings["encoder"], settings.get("pool"), settings.get("blocks"))
    if splits:
        settings["splits"] = tuple(s.strip() for s in splits.split(",") if s.strip())
    cfg = ExtractConfig(dataset=dataset, out=out, root=root, download=download, weights=weights,
                        overwrite=overwrite, progress=not quiet, say=typer.echo, **settings)
    init_distributed()
    run_extract(cfg)  # rank 0 says "wrote OUT", "kept the finished file OUT" or where it resumed


@app.command()
@guarded()
def info(file: Path = typer.Argument(..., help="Feature file (.h5)."),
         as_json: bool = typer.Option(False, "--json", help="Print JSON instead of text.")) -> None:
    """Print a feature file's layout, samples per split and class, dim, dtype and provenance."""
    from .featurestore import describe, read_features

    d = describe(file)
    read_features(file, load="labels")  # full validation (NaN/Inf scanned chunk by chunk, label range)
    if as_json:
        typer.echo(json.dumps(d, indent=2, default=str))
        return
    names = json.loads(d["attrs"]["class_names"])
    typer.echo(f"{d['path']}: {d['attrs'].get('encoder')} on {d['attrs'].get('dataset')}, "
               f"K={d['num_classes']} classes, D={d['dim']}")
    for s, sp in d["splits"].items():
        typer.echo(f"  /{s}: {sp['rows']} rows, {sp['dtype']}, chunks {tuple(sp['chunks'] or ())}, "
                   f"complete={sp['complete']}")
    typer.echo("  per class (" + ", ".join(d["splits"]) + "):")
    for k, n in enumerate(names):
        typer.echo(f"    {k:>4} {n:<24} " + " ".join(f"{sp['per_class'][k]:>7}" for sp in d["splits"].values()))
    typer.echo("  provenance:")
    for key, v in sorted(d["attrs"].items()):
        if key != "class_names":
            typer.echo(f"    {key} = {v}")


def _method_params(items: list[str]) -> dict[str, dict]:
    """``--set mr2.p=2 --set focal.gamma=1`` → {"mr2": {"p": 2.0}, "focal": {"gamma": 1.0}}."""
    out: dict[str, dict] = {}
    for item in items:
        try:
            lhs, value = item.split("=", 1)
            method, key = lhs.split(".", 1)
        except ValueError:
            raise UserError(f"--set takes METHOD.PARAM=VALUE, got {item!r}") from None
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = value
        out.setdefault(method, {})[key] = parsed
    return out


@app.command()
@guarded("rerun the same command to resume: finished seeds are kept in OUT/parts")
@with_settings(TABLE)
def train(
    ctx: typer.Context,
    features: Optional[Path] = typer.Option(None, "--features", "-f", help="Feature file (.h5). Default: the "
                                            "bundled Fashion-MNIST × EfficientNet-Lite0 subset."),
    out: Path = typer.Option(Path("runs/default"), "--out", "-o", help="Run folder for results.json, tables."),
    methods: str = typer.Option("ce,mr2", "--methods", "-m", help="Comma-separated methods (see `mr2probe "
                                "methods`), or 'all'."),
    head: str = typer.Option("linear", "--head", help="Probe head: linear or cosine."),
    adapter: str = typer.Option("none", "--adapter", help="Trainable adapter before the head: none, linear, mlp."),
    seeds: int = typer.Option(3, "--seeds", help="Number of seeds (0..N-1); each seed fixes init and data order."),
    set_: list[str] = typer.Option([], "--set", help="Fix a method hyperparameter: METHOD.PARAM=VALUE "
                                   "(e.g. mr2.p=5, mr2.lam=0.5, mr2.stats=ema); repeatable."),
    train_profile: str = typer.Option("full", "--train-profile", help="Training-set profile (train only; val and "
                                      "test untouched): full, longtail:RHO (n_r = n_max·RHO^(−r/(K−1)) over a seeded "
                                      "class order), shots:N (N per class) or fraction:F."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars."),
    wide: bool = typer.Option(False, "--wide", help="Print every column of the table, not the compact one."),
    test_features: Optional[Path] = typer.Option(None, "--test-features", help="A shifted test set scored after "
                                                 "training, as `report --test-features`."),
    class_map: Optional[Path] = typer.Option(None, "--class-map", help="With --test-features: CSV (header, then "
                                             "their class,our class per row); default: classes matched by name."),
    config: Optional[Path] = typer.Option(None, "--config", help="TOML file with a [train] table: the keys of a "
                                          "suite's [train] (every setting flag below by its name, e.g. lr = [1e-3, "
                                          "1e-2], plus set = {mr2 = {p = 2}}); flags given on the command line win."),
    print_config: bool = typer.Option(False, "--print-config", help="Print the [train] table this command would "
                                      "run with (file, flags and defaults merged) and exit without training."),
    settings: dict = None,  # the options of mr2probe.settings.TRAIN and REPORT (--epochs, --lr, --no-null, ...)
) -> None:
    """Train probes with the chosen methods and seeds on cached features; writes results.json and the table
    (under `torchrun --nproc_per_node=N -m mr2probe train ...` the seed stacks are spread over N processes)."""
    from .experiment import config_from_settings, run_experiment
    from .methods import resolve_methods
    from .report import clear_rendered, report_run, terminal_table
    from .tracking import tracked

    settings, params = _with_config_file(ctx, config, settings, _method_params(set_))
    if print_config:
        from .recipes import train_config_toml

        typer.echo(train_config_toml({**settings, "set": params}), nl=False)
        return
    if features is None:
        features = default_features()
        typer.echo(f"no --features given: using the bundled file {features}", err=True)
    names, skipped = resolve_methods(methods, adapter)
    if skipped:
        typer.echo(f"--methods all: skipping {', '.join(skipped)} (needs --adapter linear or mlp)", err=True)
    if seeds < 1:
        raise UserError(f"--seeds must be ≥ 1, got {seeds}")
    report, settings = split_report(settings)
    cfg = config_from_settings(features, out, names, list(range(seeds)), head, adapter, settings,
                               params, train_profile, progress=not quiet)
    cfg.check()  # bad input refused before anything is said or written
    _check_shifted(test_features, class_map, features)
    if cfg.reference_method != settings["reference"]:
        typer.echo(f"the reference {settings['reference']} is not among --methods: {cfg.reference_method} is the "
                   f"reference (the groups and every Δ are against it); add {settings['reference']} to --methods, "
                   f"or pass --reference {cfg.reference_method}", err=True)
    init_distributed()
    before = _mtime(out / "results.json")
    with tracked(cfg, out.name) as tracker:  # --log: the experiment tracker (rank 0; none without --log)
        run_experiment(cfg, on_epoch=tracker.epoch)
        if rank_world()[0] != 0:
            return  # under torchrun rank 0 writes and reports the run folder
        # a finished folder that already held these results is kept as it is; only its tables are rendered again
        kept = before is not None and before == _mtime(out / "results.json")
        gone = [] if kept else clear_rendered(out)  # plots and report.html of the folder's earlier results
        summary = report_run(out, report["groups_on"], margin=report["equivalence_margin"]).summary
        tracker.final(summary, out)
    typer.echo(terminal_table(summary, wide=wide))
    if test_features is not None:
        typer.echo(_shifted_text(out, test_features, class_map, report["groups_on"]))
    tables = "table.md (every column), table.csv, table.tex, summary.json, metrics.csv, per_class.csv"
    typer.echo(f"kept {out}/results.json (it already held these results); rendered {tables}" if kept
               else f"wrote {out}/results.json, {tables}")
    if gone:
        typer.echo(f"removed {', '.join(gone)} of the earlier results (`mr2probe report {out}` draws the plots "
                   "again)", err=True)


def _check_shifted(test_features: Path | None, class_map: Path | None, run_features: Path | None = None) -> None:
    """--class-map only with --test-features; with ``run_features`` (train) the shifted file and map are checked
    against the features to train on, before training."""
    if class_map is not None and test_features is None:
        raise UserError("--class-map needs --test-features")
    if test_features is not None and run_features is not None:
        from .shifted import check_shifted

        check_shifted(test_features, run_features, class_map)


def _shifted_text(run_dir: Path, test_features: Path, class_map: Path | None, groups_on: str) -> str:
    """``mr2probe.shifted.shifted_report`` on one run folder: what to print."""
    from .shifted import shifted_report

    return shifted_report(run_dir, test_features, class_map, group_on=groups_on)[1]


def _with_config_file(ctx: typer.Context, config: Path | None, settings: dict, params: dict[str, dict]
                      ) -> tuple[dict, dict[str, dict]]:
    """The training settings and ``--set`` parameters with ``--config``'s [train] table under the flags given on
    the command line (a flag left at its default takes the file's value)."""
    if config is None:
        return settings, params
    from .recipes import load_train_config

    file = load_train_config(config)
    given = {n for n in settings if getattr(ctx.get_parameter_source(n), "name", "") == "COMMANDLINE"}
    merged = {n: (v if n in given or n not in file else file[n]) for n, v in settings.items()}
    sets = file.get("set", {})
    return merged, {m: {**sets.get(m, {}), **params.get(m, {})} for m in dict.fromkeys([*sets, *params])}


def _mtime(path: Path) -> int | None:
    """``path``'s modification time in ns, or None when there is no such file."""
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def default_features() -> Path:
    """The bundled real feature file (Fashion-MNIST × EfficientNet-Lite0, stratified subset)."""
    from importlib import resources

    return Path(str(resources.files("mr2probe") / "data" / "fmnist-effl0-small.h5"))


@app.command()
@guarded()
@with_settings(REPORT)
def report(
    run_dirs: list[Path] = typer.Argument(..., help="Run folder(s) holding results.json; each folder is one "
                                          "(encoder, dataset, head) setting."),
    no_null: bool = typer.Option(False, "--no-null", help="Leave the null control's rows out of the tables."),
    summary: Optional[Path] = typer.Option(None, "--summary", help="Where the Δ summary across runs (ΔHard, ΔEasy, "
                                           "ΔAll of each method vs the reference, per run and averaged) goes: "
                                           "PATH.md + PATH.csv, or summary.md + summary.csv inside PATH if it is a "
                                           "folder. Default with 2+ run folders: summary.md/summary.csv in their "
                                           "common parent folder. Always printed too."),
    html: bool = typer.Option(False, "--html", help="Also write one self-contained report.html (tables + plots as "
                              "embedded PNGs): in the run folder for one run; beside summary.md for several."),
    no_plots: bool = typer.Option(False, "--no-plots", help="Skip the PNG plots (per_class, groups, variability, "
                                  "tradeoff)."),
    wide: bool = typer.Option(False, "--wide", help="Print every column of each run's table, not the compact one "
                              "(table.md and table.csv always hold every column)."),
    test_features: Optional[Path] = typer.Option(None, "--test-features", help="A shifted test set: apply each "
                                                 "run's heads to this feature file's test split and write "
                                                 "shifted-STEM.md/.csv (All/Hard/Worst, the run's hard set)."),
    class_map: Optional[Path] = typer.Option(None, "--class-map", help="With --test-features: CSV (header, then "
                                             "their class,our class per row); default: classes matched by name."),
    settings: dict = None,  # the options of mr2probe.settings.REPORT (--groups-on, --equivalence-margin)
) -> None:
    """Rebuild the tables from results.json without training: table.md / table.csv / table.tex (mean ± std over
    seeds, best per column in bold) and summary.json in every run folder, plus per_class.png, groups.png,
    variability.png and tradeoff.png; with several run folders also a Δ summary across them."""
    from .report import run_report

    groups_on, margin = settings["groups_on"], settings["equivalence_margin"]
    _check_shifted(test_features, class_map)
    for d in run_dirs if test_features is not None else []:
        typer.echo(_shifted_text(d, test_features, class_map, groups_on))
    typer.echo(run_report(run_dirs, groups_on, summary, html, plots=not no_plots, null=not no_null, margin=margin,
                          wide=wide))


@app.command()
def methods() -> None:
    """List the registered training methods (losses) with their default hyperparameters."""
    from .methods import METHODS

    for name, doc in METHODS.describe().items():
        cls = METHODS.get(name)
        typer.echo(f"{name:<18} {doc}")
        if cls.defaults:
            typer.echo(f"{'':<18}   defaults: {json.dumps(cls.defaults)}  grid: {json.dumps(cls.grid)}")
    from .probes import PROBES

    for name, doc in PROBES.describe().items():
        typer.echo(f"{name:<18} exact probe: {doc}")


@app.command()
def encoders() -> None:
    """List the registered encoders (exact names and name families such as clip:ARCH/TAG)."""
    from .encoders import ENCODERS

    for name, doc in ENCODERS.describe().items():
        typer.echo(f"{name:<24} {doc}")


@app.command()
def datasets() -> None:
    """List the registered datasets."""
    from .datasets import DATASETS

    for name, doc in DATASETS.describe().items():
        typer.echo(f"{name:<24} {doc}")


@app.command()
@guarded("rerun the same command to resume: cached features and finished seeds are kept")
def bench(
    suite: Path = typer.Argument(..., help="Suite file (TOML; see benchmarks/ and `mr2probe.bench`)."),
    data_root: Optional[Path] = typer.Option(None, "--data-root", help="Folder holding one folder per dataset "
                                             "(DATA_ROOT/<dataset>); the suite's roots table wins."),
    features_dir: Path = typer.Option(Path("features"), "--features-dir", help="Feature cache: "
                                      "<dataset>-<encoder>[-pc<N>].h5 and derived (synthetic: / spread:) files, "
                                      "kept when finished."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Run folders, comparisons and summary.md. "
                                       "Default: runs/<suite name>."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars."),
    report_only: bool = typer.Option(False, "--report-only", help="No extraction or training: report every run "
                                     "folder that has a results.json again with the current protocol (tables "
                                     "and plots, no report.html), then the [[compare]] files and summary.md."),
) -> None:
    """Run a benchmark suite: extract, train and report every dataset × encoder × head and every [[runs]]
    entry, then the [[compare]] files and summary.md; a cell or run whose data, weights or features are missing
    is skipped with one line (under `torchrun --nproc_per_node=N -m
    mr2probe bench ...` every extraction and every run is spread over N processes; rank 0 reports)."""
    from .bench import load_suite, run_suite

    init_distributed()
    rank = rank_world()[0]
    run_suite(load_suite(suite), data_root, features_dir, out, progress=not quiet and rank == 0,
              log=(lambda m: typer.echo(m, err=True)) if rank == 0 else (lambda m: None), report_only=report_only)


@app.command("import")
@guarded()
def import_(
    src: Path = typer.Argument(..., help="An .npz with {split}_features / {split}_labels (optional class_names), or "
                               "a folder of per-split .npy/.pt arrays (CLIP_benchmark's features_{split}.pt, "
                               "targets_{split}.pt)."),
    out: Path = typer.Option(..., "--out", "-o", help="Feature file (.h5) to write; written as OUT.partial and "
                             "renamed when whole."),
    encoder: str = typer.Option("imported", "--encoder", "-e", help="The file's encoder attribute."),
    dataset: str = typer.Option("imported", "--dataset", "-d", help="The file's dataset attribute."),
    class_names: Optional[Path] = typer.Option(None, "--class-names", help="Class names, index = label: a JSON "
                                               "list or a text file with one per line (wins over names in SRC)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace OUT if it exists."),
) -> None:
    """Turn features made by other tools into a feature file (validated like one: train and test, same D,
    no NaN/Inf, labels in [0, K))."""
    from .featurestore import read_features
    from .importer import import_features

    path = import_features(src, out, encoder=encoder, dataset=dataset, class_names=class_names, overwrite=overwrite)
    fs = read_features(path, load=False)
    typer.echo(f"wrote {path}: K={fs.num_classes} classes, D={fs.dim}, "
               + ", ".join(f"{s} {n}" for s, n in fs.rows.items()))


@app.command()
@guarded()
def predict(
    run_dir: Path = typer.Argument(..., help="Run folder written by `mr2probe train` (holds heads.safetensors)."),
    features: Path = typer.Option(..., "--features", "-f", help="Feature file (.h5) with the run's D and classes."),
    split: str = typer.Option("test", "--split", help="Split of the feature file to predict."),
    out: Path = typer.Option(..., "--out", "-o", help="Output .csv (a column per method/seed) or .npz."),
    device: Optional[str] = typer.Option(None, "--device", help="torch device [cuda if available, else cpu]."),
) -> None:
    """Apply the head selected on val of every (method, seed) of a run to a feature file's split."""
    from .predict import ROW_COLUMNS, agreement_with_run, methods_without_heads, predict_run, write_predictions

    df = predict_run(run_dir, features, split, device)
    typer.echo(f"wrote {write_predictions(df, out)}: {len(df)} rows × {len(df.columns) - len(ROW_COLUMNS)} heads")
    if missing := methods_without_heads(run_dir, df):
        typer.echo(f"not predicted: {', '.join(missing)} (no saved head: exact probes are fitted by scikit-learn and "
                   "not kept; their test predictions are in the run's predictions.npz)", err=True)
    if split == "test" and (agree := agreement_with_run(run_dir, df)) is not None:
        typer.echo(f"against the run's own test predictions: {int((agree == 1).sum())} of {len(agree)} heads "
                   f"identical; least agreement {agree.min():.2%} ({agree.idxmin()}), "
                   f"{int(round((1 - agree.min()) * len(df)))} of {len(df)} images")


@app.command()
@guarded()
def synth(
    spec: str = typer.Argument(..., help="synthetic:K=10,D=64,n=200,spread=1:2:3|ramp:1-3,sep=3,seed=0 (Gaussian "
                               "class clusters) or spread:PATH,classes=0:3:5,factor=2 (a feature file with those "
                               "classes spread about their train means); formulas in mr2probe/synthetic.py."),
    out: Path = typer.Option(..., "--out", "-o", help="Feature file (.h5) to write (temporary name, then renamed); "
                             "kept as it is when it already holds this spec."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace OUT if it holds other features."),
) -> None:
    """Write the feature file of a synthetic: or spread: spec (a positive control for MR2)."""
    from .featurestore import read_features
    from .synthetic import materialize_to

    fs = read_features(materialize_to(spec, out, overwrite=overwrite), load=False)
    typer.echo(f"wrote {fs.path}: K={fs.num_classes} classes, D={fs.dim}, "
               + ", ".join(f"{s} {n}" for s, n in fs.rows.items()))


def main() -> None:
    app(prog_name="mr2probe")


if __name__ == "__main__":
    sys.exit(main())
