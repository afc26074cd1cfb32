"""Successive halving against the full grid: the same experiment trained with ``search="full"`` and each halving
variant (``--searches``: ``halving``, ``halving-restarts``).

Per case, every run in this process (``run_experiment``, fresh folders, the default budget unless given):
  halving/full wall time   of the whole train stage (every seed stack and the null control)
  halving/full head-steps  Σ over grid entries of the steps each head trained (full: T per head; halving: its
                           ``stopped_at``)
  agreement of the chosen heads, per (method, seed): the share with |Δ test acc| ≤ 0.2 point (and with halving
                           not worse than −0.2 point), the share with
                           |Δ ΔHard| ≤ 0.2 point and ≤ the null control's SD of ΔHard over seeds (ΔHard = mean
                           test accuracy over the hard classes minus the reference's of the same seed, points; hard
                           = bottom ⌊K/3⌋ of the reference's val accuracy in the full run, the same classes for
                           both), the share choosing the same grid point
Cases: "bundled" = mr2probe/data/fmnist-effl0-small.h5 (2000 × 1280, K = 10; val: 10% of train), every method
without an adapter, 3 seeds; "synthetic" = Gaussian classes (``synthetic:K=100,D=768,n=100,spread=ramp:1-3,sep=6``:
10000 × 768 per split), five methods, 2 seeds, 10 epochs or ``--min-steps`` (default 200); and one case per
``--features`` file × ``--heads`` head (every method without an adapter, ``--seeds`` seeds, the default budget).
Usage: OMP_NUM_THREADS=1 python benchmarks/speed_halving.py [--cases bundled,synthetic] [--min-steps N]
       [--features A.h5,B.h5 --heads linear,cosine --seeds 3] [--searches halving,halving-restarts]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mr2probe.experiment import config_from_settings, run_experiment
from mr2probe.jsonfile import grid_rows
from mr2probe.methods import METHODS
from mr2probe.metrics import class_groups
from mr2probe.synthetic import materialize

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = ROOT / "mr2probe" / "data" / "fmnist-effl0-small.h5"
TOL = 0.2  # points
FROZEN = [m for m in METHODS.names() if not METHODS.get(m).needs_adapter]  # every method without an adapter


def head_steps(res: dict[str, Any]) -> int:
    """Σ over every run's grid entries of the steps its head trained."""
    steps = res["budget"]["steps"]
    return sum(g.get("stopped_at", steps) for r in res["runs"] for g in grid_rows(r["grid"]))


def delta_hard(res: dict[str, Any], hard: np.ndarray) -> dict[tuple[str, int], float]:
    """ΔHard per (method, seed) in points: mean test acc over ``hard`` minus the reference's (same seed)."""
    ref = {r["seed"]: np.asarray(r["per_class_acc"])[hard].mean() for r in res["runs"]
           if r["method"] == res["reference"]}
    return {(r["method"], r["seed"]): 100 * (np.asarray(r["per_class_acc"])[hard].mean() - ref[r["seed"]])
            for r in res["runs"] if r["seed"] in ref and r["method"] != res["reference"]}


def null_sd(res: dict[str, Any], hard: np.ndarray) -> float | None:
    """SD over seeds of the null control's ΔHard (its i-th seed against the reference's i-th), points."""
    null = res.get("null_control") or {}
    hard_acc = {(r["method"], r["seed"]): 100 * np.asarray(r["per_class_acc"])[hard].mean() for r in res["runs"]}
    ref = sorted(s for m, s in hard_acc if m == res["reference"])
    nul = sorted(s for m, s in hard_acc if m == null.get("method"))
    d = [hard_acc[null["method"], n] - hard_acc[res["reference"], r] for n, r in zip(nul, ref)]
    return float(np.std(d, ddof=1)) if len(d) > 1 else None


def case(name: str, feats: Path, methods: list[str], seeds: int, values: dict[str, Any], work: Path,
         head: str = "linear", searches: tuple[str, ...] = ("halving",)) -> None:
    out: dict[str, tuple[dict[str, Any], float]] = {}
    for search in ("full", *searches):
        cfg = config_from_settings(feats, work / f"{name}-{search}", methods, list(range(seeds)), head=head,
                                   values={**values, "search": search, "device": "cpu"}, progress=False)
        t0 = time.perf_counter()
        res = run_experiment(cfg)
        out[search] = (res, time.perf_counter() - t0)
    full, t_full = out["full"]
    print(f"[{name}] {feats.name}: {len(methods)} methods, {seeds} seeds (+ null control), T = "
          f"{full['budget']['steps']} steps")
    for search in searches:
        compare(f"[{name}] [{search}]", full, t_full, *out[search])


def compare(tag: str, full: dict[str, Any], t_full: float, half: dict[str, Any], t_half: float) -> None:
    """Print cost and agreement of one halving run against the full grid's, each line headed by ``tag``."""
    hs_full, hs_half = head_steps(full), head_steps(half)
    print(f"{tag} rungs {[r['step'] for r in half['budget']['search']['rungs']]}")
    print(f"{tag} wall time: full {t_full:.1f} s, halving {t_half:.1f} s: halving/full={t_half / t_full:.3f}")
    print(f"{tag} head-steps: full {hs_full}, halving {hs_half}: halving/full={hs_half / hs_full:.3f}")
    runs_f = {(r["method"], r["seed"]): r for r in full["runs"]}
    runs_h = {(r["method"], r["seed"]): r for r in half["runs"]}
    ref_val = np.mean([r["val_per_class_acc"] for r in full["runs"] if r["method"] == full["reference"]], axis=0)
    hard = class_groups(ref_val).hard
    dh_f, dh_h = delta_hard(full, hard), delta_hard(half, hard)
    d_acc = {k: 100 * (runs_h[k]["test_acc"] - runs_f[k]["test_acc"]) for k in runs_f}
    d_dh = {k: dh_h[k] - dh_f[k] for k in dh_f}
    same = [runs_h[k]["hparams"] == runs_f[k]["hparams"] for k in runs_f]
    for m in dict.fromkeys(k[0] for k in runs_f):
        keys = [k for k in runs_f if k[0] == m]
        acc = " ".join(f"{100 * runs_f[k]['test_acc']:.2f}/{100 * runs_h[k]['test_acc']:.2f}" for k in keys)
        dh = " ".join(f"{dh_f[k]:+.2f}/{dh_h[k]:+.2f}" for k in keys if k in dh_f)
        print(f"{tag}   {m:18s} test acc full/halving per seed: {acc}" + (f"; ΔHard: {dh}" if dh else ""))
    print(f"{tag} |Δ test acc| ≤ {TOL} pt: {np.mean([abs(v) <= TOL for v in d_acc.values()]):.3f} of "
          f"{len(d_acc)} (method, seed); Δ test acc ≥ −{TOL} pt (halving not worse): "
          f"{np.mean([v >= -TOL for v in d_acc.values()]):.3f}; max |Δ| {max(abs(v) for v in d_acc.values()):.2f} "
          f"pt; mean Δ {np.mean(list(d_acc.values())):+.3f} pt")
    if d_dh:
        print(f"{tag} |Δ ΔHard| ≤ {TOL} pt: {np.mean([abs(v) <= TOL for v in d_dh.values()]):.3f} of "
              f"{len(d_dh)}; max |Δ| {max(abs(v) for v in d_dh.values()):.2f} pt")
        sd = null_sd(full, hard)
        if sd is not None:
            print(f"{tag} |Δ ΔHard| ≤ the null control's SD of ΔHard ({sd:.2f} pt): "
                  f"{np.mean([abs(v) <= sd for v in d_dh.values()]):.3f} of {len(d_dh)}")
    print(f"{tag} same grid point chosen: {np.mean(same):.3f} of {len(same)}")
    n_test, acc = sum(full["test_class_counts"]), np.mean([r["test_acc"] for r in full["runs"]])
    print(f"{tag} test images {n_test}: {TOL} pt is {TOL / 100 * n_test:.0f} images; binomial SE of one "
          f"head's test acc {100 * np.sqrt(acc * (1 - acc) / n_test):.2f} pt")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="bundled,synthetic")
    ap.add_argument("--min-steps", type=int, default=None, help="budget floor (default: the setting's default)")
    ap.add_argument("--features", default="", help="feature files, comma-separated: a case per file and head")
    ap.add_argument("--heads", default="linear", help="heads of the --features cases, comma-separated")
    ap.add_argument("--seeds", type=int, default=3, help="seeds of the bundled and --features cases")
    ap.add_argument("--searches", default="halving,halving-restarts",
                    help="halving variants, comma-separated, each against the one full-grid run")
    args = ap.parse_args()
    steps = {} if args.min_steps is None else {"min_steps": args.min_steps}
    searches = tuple(filter(None, args.searches.split(",")))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in filter(None, args.cases.split(",")):
            if name == "bundled":
                case(name, BUNDLED, FROZEN, args.seeds, steps, work, searches=searches)
            elif name == "synthetic":
                feats = materialize("synthetic:K=100,D=768,n=100,spread=ramp:1-3,sep=6,seed=0", work)
                case(name, feats, ["ce", "mr2", "focal", "logit_adjust", "class_balanced"], 2,
                     {"epochs": 10, "min_steps": 200, **steps}, work, searches=searches)
        for feats in filter(None, args.features.split(",")):
            for head in args.heads.split(","):
                case(f"{Path(feats).stem}-{head}", Path(feats), FROZEN, args.seeds, steps, work, head, searches)


if __name__ == "__main__":
    main()
