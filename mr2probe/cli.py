"""The ``mr2probe`` command line: a thin typer layer over functions usable from Python.

Every ``UserError`` becomes one line on stderr and exit code 2; Ctrl-C says how to resume and exits 130.
"""
from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Callable, Optional

import typer

from .errors import UserError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
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
                fail(f"interrupted; {resume_hint or 'nothing was written'}", 130)

        return wrapper

    return deco


@app.command()
@guarded("rerun the same command to resume: finished rows are kept in OUT.partial")
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
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Images per forward pass [64]."),
    workers: Optional[int] = typer.Option(None, "--workers", help="DataLoader worker processes [-1 = cpus-1, ≤8]."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="Stored feature dtype: float16 or float32 [float16]."),
    amp: Optional[str] = typer.Option(None, "--amp", help="Autocast on CUDA: bf16, fp16 or off [bf16]."),
    runtime: Optional[str] = typer.Option(None, "--runtime", help="CPU runtime for torch encoders: auto, torch or "
                                          "onnx [auto = onnxruntime when installed]."),
    per_class: Optional[int] = typer.Option(None, "--per-class", help="Stratified subset: at most N samples per "
                                            "class in each split (seeded)."),
    splits: Optional[str] = typer.Option(None, "--splits", help="Comma-separated splits [train,val,test: those "
                                         "the dataset has]."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Start over instead of resuming / keeping."),
    device: Optional[str] = typer.Option(None, "--device", help="torch device [cuda if available, else cpu]."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Run a frozen encoder over a dataset and cache features + labels + provenance in HDF5 (resumable;
    under `torchrun --nproc_per_node=N -m mr2probe extract ...` each split is sharded over N processes)."""
    from .extract import ExtractConfig, extract as run_extract, init_distributed
    from .recipes import load_recipe

    settings = load_recipe(recipe) if recipe else {}
    given = dict(encoder=encoder, batch_size=batch_size, workers=workers, dtype=dtype, amp=amp, runtime=runtime,
                 per_class=per_class, device=device)
    settings.update({k: v for k, v in given.items() if v is not None})
    if not settings.get("encoder"):
        raise UserError("--encoder (or --recipe) is required; see `mr2probe encoders`")
    if not dataset:
        raise UserError("--dataset is required; see `mr2probe datasets`")
    if out is None:
        out = Path("features") / f"{dataset}-{settings['encoder'].replace(':', '_').replace('/', '_')}.h5"
    if splits:
        settings["splits"] = tuple(s.strip() for s in splits.split(",") if s.strip())
    cfg = ExtractConfig(dataset=dataset, out=out, root=root, download=download, weights=weights,
                        overwrite=overwrite, progress=not quiet, **settings)
    init_distributed()
    path = run_extract(cfg)
    from .extract import _dist

    if _dist()[0] == 0:
        typer.echo(f"wrote {path}")


@app.command()
@guarded()
def info(file: Path = typer.Argument(..., help="Feature file (.h5)."),
         as_json: bool = typer.Option(False, "--json", help="Print JSON instead of text.")) -> None:
    """Print a feature file's layout, samples per split and class, dim, dtype and provenance."""
    from .featurestore import describe, read_features

    d = describe(file)
    read_features(file)  # full validation (NaN/Inf, label range) before saying it is fine
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


def main() -> None:
    app(prog_name="mr2probe")


if __name__ == "__main__":
    sys.exit(main())
