"""Speed of the sweep engine: all methods × seeds × grid points trained as stacked heads.

Three ratios, each against a reference measured in the same run:
  sweep/sequential  the stacked sweep against the same heads trained one after another
  sweep/gemm        the sweep against the bare matrix products it needs (forward X·Wᵀ and the weight gradient
                    Gᵀ·X for every step, same shapes — per head chunk where the CPU trains a stack in chunks
                    — same FLOPs) — target ≤ 2
  ce/sklearn_time   one CE probe (ours) against sklearn's LogisticRegression on the real Fashion-MNIST ×
                    EfficientNet-Lite0 features, both reaching the test accuracy printed beside (target ≤ 0.2)
Shapes: "fmnist" = 60000 × 1280, K = 10 (synthetic Gaussian classes of that shape); "imagenet" = N × 768,
K = 1000 with a scaled-down N (default 4096) so it runs on a CPU.
Every timing is repeated (``--repeats``, 3), the sweep and its references interleaved in each repeat; the ratios
are of the medians.
Usage: python benchmarks/speed_sweep.py [--shapes fmnist,imagenet] [--epochs 1] [--repeats 3] [--features FILE]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from mr2probe.methods import METHODS
from mr2probe.trainer import TrainConfig, TrainData, chunk_size, expand_runs, head_chunks, train_stack

SHAPES = {"fmnist": (60000, 1280, 10), "imagenet": (4096, 768, 1000)}


def synthetic(n: int, d: int, k: int, seed: int = 0) -> TrainData:
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % k
    centers = torch.randn(k, d, generator=g)
    x = centers[y] + 2.0 * torch.randn(n, d, generator=g)
    return TrainData(x, y, x[: max(k, n // 10)], y[: max(k, n // 10)], k)


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bare_gemms(data: TrainData, chunks: list[int], steps: int, batch: int) -> float:
    """The products a sweep step needs, per chunk of h heads: logits = X_b Wᵀ ([B, D] × [D, h·K]) and
    grad_W = Gᵀ X_b (one chunk of all H heads where the stack is not chunked)."""
    d, k = data.x.shape[1], data.num_classes
    ws = [torch.randn(h * k, d) * 0.01 for h in chunks]
    n = len(data.y)

    def run() -> None:
        for w in ws:
            for s in range(steps):
                i = (s * batch) % max(n - batch, 1)
                xb = data.x[i:i + batch]
                g = xb @ w.T
                _ = g.T @ xb

    return timed(run)


def machine_gemm_rate(size: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of a large square float32 product on this machine (its own GEMM rate, timed in the same run)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    t = timed(lambda: [a @ b for _ in range(repeats)])
    return 2 * size**3 * repeats / t


def peak_rss_gib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def median(values: list[float]) -> float:
    return float(np.median(values))


def sweep_ratios(name: str, methods: list[str], seeds: list[int], epochs: int, batch: int,
                 sequential: bool = True, wide: bool = False, repeats: int = 3) -> None:
    """Each timing ``repeats`` times, the candidate (the sweep) and its references interleaved in every repeat (the
    machine may be shared: a load that comes and goes hits both alike); medians. Each sweep starts from fresh data,
    so what it shares between seeds (the statistics of the frozen features) is computed once per sweep."""
    n, d, k = SHAPES[name]
    cfg = TrainConfig(epochs=epochs, batch_size=batch, min_steps=0, progress=False)
    specs = expand_runs(methods, seeds, cfg)
    by_seed = {s: [sp for sp in specs if sp.seed == s] for s in seeds}
    one = TrainConfig(**{**cfg.__dict__, "chunk_mib": 0})  # --wide: the stacks without head chunks (as on a GPU)
    base = synthetic(n, d, k)
    steps = epochs * -(-n // batch)
    size = chunk_size(cfg, k, base.x.device)
    chunks = [[len(c) for c in (head_chunks(sorted(ss, key=lambda s: s.method), size) if size else [ss])]
              for ss in by_seed.values()]

    def fresh() -> TrainData:  # the same features, nothing computed from them yet
        return TrainData(base.x, base.y, base.val_x, base.val_y, base.num_classes)

    def sweep(c: TrainConfig) -> float:
        data = fresh()
        return timed(lambda: [train_stack(data, ss, c) for ss in by_seed.values()])

    t = {"sweep": [], "sequential": [], "wide": [], "gemm": []}
    for _ in range(repeats):
        t["sweep"].append(sweep(cfg))
        if sequential:
            data = fresh()
            t["sequential"].append(timed(lambda: [train_stack(data, [sp], cfg) for sp in specs]))
        if wide:
            t["wide"].append(sweep(one))
        t["gemm"].append(sum(bare_gemms(base, c, steps, batch) for c in chunks))
    t_sweep, t_gemm = median(t["sweep"]), median(t["gemm"])
    t_seq = median(t["sequential"]) if sequential else float("nan")
    print(f"[{name}] N={n} D={d} K={k}: {len(specs)} heads ({len(methods)} methods × grid × {len(seeds)} seeds), "
          f"{epochs} epoch(s), {len(chunks[0])} head chunk(s) per seed; medians of {repeats} interleaved repeats: "
          f"sweep {t_sweep:.1f} s, sequential {t_seq:.1f} s, bare GEMMs {t_gemm:.1f} s")
    ratios = sorted(a / b for a, b in zip(t["sweep"], t["gemm"]))
    print(f"[{name}] per-repeat sweep/gemm: {', '.join(f'{r:.2f}' for r in ratios)}")
    if wide:
        t_wide = median(t["wide"])
        print(f"[{name}] one wide stack {t_wide:.1f} s: sweep/one_wide_stack={t_sweep / t_wide:.3f}")
    if sequential:
        print(f"[{name}] sweep/sequential={t_sweep / t_seq:.3f}")
    print(f"[{name}] sweep/gemm={t_sweep / t_gemm:.2f}")
    flops = 2 * 2 * batch * d * len(specs) * k * steps  # the forward and weight-gradient products
    rate = machine_gemm_rate()
    print(f"[{name}] sweep achieves {flops / t_sweep / 1e9:.1f} GFLOP/s on its products; the machine's square "
          f"2048² GEMM: {rate / 1e9:.1f} GFLOP/s; peak RSS so far {peak_rss_gib():.2f} GiB")
    print(f"[{name}] sweep/machine_gemm_rate={flops / t_sweep / rate:.3f}")


def ce_vs_sklearn(features: Path, epochs: int, lr: float) -> None:
    from sklearn.linear_model import LogisticRegression

    from mr2probe.featurestore import read_features

    fs = read_features(features)
    tr, te = fs.splits["train"], fs.splits["test"]
    x, y = tr.features.astype(np.float32), tr.labels
    xt, yt = te.features.astype(np.float32), te.labels
    data = TrainData(torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(xt[:10]), torch.from_numpy(yt[:10]),
                     fs.num_classes)
    cfg = TrainConfig(epochs=epochs, batch_size=512, lr=(lr,), wd=(1e-4,), min_steps=0,
                      progress=False)
    spec = expand_runs(["ce"], [0], cfg)[:1]
    trained = {}
    t_ours = timed(lambda: trained.setdefault("s", train_stack(data, spec, cfg)))
    acc_ours = float((trained["s"].predict(torch.from_numpy(xt))[0].argmax(-1).numpy() == yt).mean())
    clf = LogisticRegression(max_iter=1000)
    t_skl = timed(lambda: clf.fit(x, y))
    acc_skl = float(clf.score(xt, yt))
    print(f"[ce vs sklearn] {features}: ours {t_ours:.1f} s → test acc {100 * acc_ours:.2f}%, "
          f"sklearn LogisticRegression(lbfgs) {t_skl:.1f} s → {100 * acc_skl:.2f}% "
          f"(difference {100 * (acc_ours - acc_skl):+.2f} pt)")
    print(f"ce/sklearn_time={t_ours / t_skl:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="fmnist,imagenet")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--no-sequential", action="store_true", help="skip the one-by-one reference (slow)")
    ap.add_argument("--wide", action="store_true", help="also time each seed as one unchunked stack")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats of the sweep and its references; "
                    "the ratios are of the medians")
    ap.add_argument("--features", type=Path, default=Path("features/fmnist-effl0.h5"))
    ap.add_argument("--ce-epochs", type=int, default=30, help="epochs of our CE probe (one head, no grid)")
    ap.add_argument("--ce-lr", type=float, default=1e-2, help="its learning rate (the grid value CE selects here)")
    args = ap.parse_args()
    torch.manual_seed(0)
    methods = [m for m in METHODS.names() if not METHODS.get(m).needs_adapter]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; methods: {', '.join(methods)}")
    for name in args.shapes.split(","):
        if name:
            sweep_ratios(name, methods, list(range(args.seeds)), args.epochs, args.batch, not args.no_sequential,
                         args.wide, args.repeats)
    if args.features.exists():
        ce_vs_sklearn(args.features, args.ce_epochs, args.ce_lr)
    else:
        print(f"[ce vs sklearn] skipped: {args.features} not found (mr2probe extract it first)")


if __name__ == "__main__":
    main()
