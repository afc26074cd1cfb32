"""The GPU path, measured in one run of at most ~5 minutes (a tiny smoke version on a machine without a GPU).

(a) extraction: ``mr2probe.extract`` (bf16 autocast, channels_last, pinned DataLoader workers) over synthetic JPEG
    files in a plain class-folder tree, so decoding is included, against the encoder's bare forward pass on the
    same, already decoded batches → ``extract/forward`` (``--preprocess device``: the workers read the files, the
    GPU decodes (nvJPEG) and preprocesses them) and ``extract_workers/forward`` (``--preprocess workers``: PIL
    in the workers), and the two pipelines' features against each other → ``device_vs_workers_cosine_min``;
(b) the sweep at the ImageNet shape: N synthetic bf16 features (trained in float32) × D = 768, K = 1000, every
    method without an adapter × its grid as one stack (one seed), a fixed number of steps, against the GPU's own
    GEMM rate measured in the same run with the sweep's product shapes ([B, D] × [D, H·K]) → ``sweep/gemm_rate``
    (the fraction of the bare products' FLOP rate the sweep reaches, counting its forward and weight-gradient products);
    The same stack is then trained under ``search="halving"`` (rungs at T/9 and T/3, η = 3) → ``halving/full``
    in wall time and in head-steps (Σ of each head's ``stopped_at`` against H·T), and in the wall time of the steps
    alone (less a one-step stack's: set-up, e.g. JTT's first stage, and evaluation do not shrink with the stack);
(c) the projected training time of the paper's grid (benchmarks/paper.toml: 7 datasets × 3 encoders × 2 heads ×
    3 seeds + the null control) from (b)'s seconds per step, scaled by each cell's B·D·H·K and its step budget
    max(30 · ⌈N / 512⌉, 1000), under the full grid and under halving (× (b)'s halving/full wall time). Extraction
    is not included;
(d) one MR2 step against one CE step (benchmarks/speed_mr2_loss.py's step, linear adapter + linear head,
    B = 512, D = 768) at K = 100 and 1000 on the same device → ``K=… mr2/ce``.
(e) the bundled feature file (mr2probe/data/fmnist-effl0-small.h5) trained end to end on the device and on the CPU
    (``run_experiment``, four methods, one seed, halving) → the largest |Δ test acc| between them, in points.
Each part runs even when an earlier one fails (its error is printed); the exit status is then 1.

Usage: ``python benchmarks/gpu_check.py [--smoke]`` (``--smoke``, or no CUDA device: tiny sizes, CPU, < 2 min).
Every figure printed is measured by this run; the sizes used are printed with it.
"""
from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from mr2probe.methods import METHODS
from mr2probe.trainer import TrainConfig, TrainData, budget, expand_runs, train_stack
from mr2probe.heads import ProbeConfig

# the paper's datasets: training rows and classes (torchvision splits; Flowers-102 and Aircraft: train + val)
PAPER_DATASETS = {"imagenet": (1_281_167, 1000), "cifar100": (50_000, 100), "oxford-pets": (3_680, 37),
                  "stanford-cars": (8_144, 196), "flowers102": (2_040, 102), "food101": (75_750, 101),
                  "fgvc-aircraft": (6_667, 100)}
PAPER_ENCODER_DIMS = {"mae-vit-b16": 768, "mocov2-r50": 2048, "clip-vit-b16": 512}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def peak_memory(device: torch.device) -> str:
    if device.type == "cuda":
        return f"peak GPU memory {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB"
    import resource

    return f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB"


def jpeg_tree(root: Path, n: int, classes: int = 4, size: int = 256) -> None:
    """``n`` random-noise JPEGs in ``root/<class>/`` (a plain ImageFolder tree)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(n):
        folder = root / f"c{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(folder / f"{i}.jpg", quality=90)


def extraction(args: argparse.Namespace, device: torch.device) -> None:
    from mr2probe.datasets import build_dataset
    from mr2probe.encoders import build_encoder
    from mr2probe.extract import ExtractConfig, extract, worker_output
    from mr2probe.featurestore import read_features

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "jpegs"
        jpeg_tree(root, args.images)
        cfg = ExtractConfig(encoder=args.encoder, dataset="imagefolder:0.8,0,0.2", root=root,
                            out=Path(tmp) / "f.h5", batch_size=args.batch_size, workers=args.workers, amp="bf16",
                            runtime="torch", overwrite=True, progress=False, device=str(device))
        old = dataclasses.replace(cfg, out=Path(tmp) / "workers.h5", preprocess="workers")
        extract(cfg)  # warm-up: first build, cudnn autotuning, page cache
        t_extract = timed(lambda: extract(cfg), device)
        t_workers = timed(lambda: extract(old), device)
        cos = min(torch.nn.functional.cosine_similarity(torch.from_numpy(a.features).float(),
                                                        torch.from_numpy(b.features).float()).min().item()
                  for a, b in zip(read_features(cfg.out).splits.values(), read_features(old.out).splits.values()))
        encoder = build_encoder(args.encoder).to(device)
        data = build_dataset("imagefolder:0.8,0,0.2", root)
        images = [encoder.transform(s.image(i)) for s in data.splits.values() for i in range(len(s.labels))]
        batches = [torch.stack(images[i:i + args.batch_size]) for i in range(0, len(images), args.batch_size)]
        batches = [b.to(device).contiguous(memory_format=torch.channels_last) for b in batches]

        def forward() -> None:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                for b in batches:
                    encoder.encode(b)

        forward()
        t_forward = timed(forward, device)
    n = len(images)
    print(f"(a) extraction, {args.encoder} on {n} synthetic {256}px JPEGs, batch {args.batch_size}, "
          f"{args.workers} workers, {device}: extract {n / t_extract:.1f} img/s (decode + transform + forward + "
          f"HDF5; workers' output {worker_output('device', device)!r}), with --preprocess workers "
          f"{n / t_workers:.1f} img/s, bare forward {n / t_forward:.1f} img/s")
    print(f"extract/forward={t_forward / t_extract:.3f}")
    print(f"extract_workers/forward={t_forward / t_workers:.3f}")
    print(f"device_vs_workers_cosine_min={cos:.6f}")


def sweep(args: argparse.Namespace, device: torch.device) -> tuple[float, float]:
    """(b); returns the sweep's seconds per step per unit of B·D·H·K (for the projection) and halving/full."""
    n, d, k, b = args.rows, 768, args.classes, args.sweep_batch
    g = torch.Generator(device="cpu").manual_seed(0)
    y = torch.arange(n) % k
    x = torch.empty(n, d, dtype=torch.bfloat16)
    for i in range(0, n, 65536):  # class means + noise, in pieces (1.28M × 768 without a float32 copy)
        yy = y[i:i + 65536]
        x[i:i + 65536] = (torch.randn(k, d, generator=g)[yy] + 2 * torch.randn(len(yy), d, generator=g)).bfloat16()
    # stored as bf16 (as a feature file would hold them); the probes train in float32 (TF32 products on a GPU),
    # as `mr2probe train` does
    x, y = x.to(device).float(), y.to(device)
    data = TrainData(x, y, x[: 10 * k], y[: 10 * k], k)
    methods = [m for m in METHODS.names() if not METHODS.get(m).needs_adapter]
    cfg = TrainConfig(epochs=1, batch_size=b, min_steps=0, progress=False, device=str(device))
    specs = expand_runs(methods, [0], cfg)
    heads = len(specs)
    steps = args.steps
    sub = TrainData(x[: steps * b], y[: steps * b], data.val_x, data.val_y, k)  # one epoch = `steps` steps
    warm = max(2 * b, k)
    train_stack(TrainData(x[:warm], y[:warm], data.val_x, data.val_y, k), specs, cfg)  # warm-up
    t_sweep = timed(lambda: train_stack(sub, specs, cfg), device)
    cfg_h = TrainConfig(epochs=1, batch_size=b, min_steps=0, progress=False, device=str(device), search="halving")
    halved: list = []
    t_half = timed(lambda: halved.append(train_stack(sub, specs, cfg_h)), device)
    head_steps = sum(halved[0].stopped_at)
    one = TrainData(x[:b], y[:b], data.val_x, data.val_y, k)  # set-up, one step, evaluation: what steps do not scale
    t_fixed = timed(lambda: train_stack(one, specs, cfg), device)
    w = torch.randn(heads * k, d, device=device, dtype=x.dtype) * 0.01

    def gemms() -> None:
        for s in range(steps):
            xb = x[s * b:(s + 1) * b]
            gz = xb @ w.T  # forward logits [B, H·K]
            _ = gz.T @ xb  # weight gradient [H·K, D]

    gemms()
    t_gemm = timed(gemms, device)
    flops = 2 * 2 * b * d * heads * k * steps  # two products per step
    shape = "the ImageNet shape" if k == 1000 else "a reduced shape"
    print(f"(b) sweep at {shape}: N = {n} features (bf16, trained in float32) × D = {d}, K = {k}, {heads} heads "
          f"({len(methods)} methods × grid, one seed), batch {b}, {steps} steps on {device}: sweep {t_sweep:.2f} s "
          f"({flops / t_sweep / 1e12:.2f} TFLOP/s on the two products), bare products {t_gemm:.2f} s "
          f"({flops / t_gemm / 1e12:.2f} TFLOP/s, the machine's rate at these shapes); {peak_memory(device)}")
    print(f"sweep/gemm_rate={t_gemm / t_sweep:.3f}")
    print(f"(b) the same stack under successive halving (rungs {halved[0].rungs}, η = 3): {t_half:.2f} s, "
          f"{head_steps} head-steps of {heads * steps}")
    print(f"halving/full wall={t_half / t_sweep:.3f}")
    print(f"(b) of which set-up, one step and evaluation (a one-step stack): {t_fixed:.2f} s; the other "
          f"{steps - 1} steps: full {t_sweep - t_fixed:.2f} s, halving {t_half - t_fixed:.2f} s")
    print(f"halving/full steps wall={(t_half - t_fixed) / (t_sweep - t_fixed):.3f}")
    print(f"halving/full head-steps={head_steps / (heads * steps):.3f}")
    args.halving = t_half / t_sweep
    return t_sweep / steps / (b * d * heads * k), t_half / t_sweep


def adamw_pass(params: list[torch.Tensor], device: torch.device) -> float:
    """Seconds of one fused AdamW pass (torch's kernel) over tensors of the given shapes: the optimiser's floor."""
    ps = [torch.zeros_like(p) for p in params]
    gs, ms, vs = ([torch.ones_like(p) for p in params] for _ in range(3))
    count, lr = torch.ones((), device=device), torch.tensor(1e-3, device=device)

    def once() -> None:
        torch._fused_adamw_(ps, gs, ms, vs, [], [count] * len(ps), lr=lr, beta1=0.9, beta2=0.999,
                            weight_decay=1e-4, eps=1e-8, amsgrad=False, maximize=False)

    once()
    return timed(lambda: [once() for _ in range(10)], device) / 10


def step_times(args: argparse.Namespace, device: torch.device) -> float:
    """(f): one stacked step of every method without an adapter × its grid (K = 1000, D = 768; the trainer's own
    step: compiled and captured as CUDA graphs on a GPU by default) at B = 512 and B = 4096, set-up and compilation
    excluded (timed after warm-up steps), against the bare products (forward X·Wᵀ and the weight gradient) plus one
    fused AdamW pass over the stack's parameters → ``step/(gemm+adamw)``; returns seconds per step at B = 512."""
    from step_ops import build

    from mr2probe.trainer import step_runner

    k, d = args.classes, 768
    per_step = {}
    for b in args.step_batches:
        data, probe, step, opt, heads = build(args.methods, "linear", "none", k, b, d, device)
        run = step_runner(step, opt, TrainConfig(batch_size=b), device)
        idx = torch.arange(b, device=device)
        xb, yb = data.x.index_select(0, idx), data.y.index_select(0, idx)
        for _ in range(3):  # compilation, graph capture, warm-up
            run(xb, yb, idx)
        n = args.step_repeats
        t_step = timed(lambda: [run(xb, yb, idx) for _ in range(n)], device) / n
        w = torch.randn(heads * k, d, device=device) * 0.01

        def gemms() -> None:
            gz = xb @ w.T
            _ = gz.T @ xb

        gemms()
        t_gemm = timed(lambda: [gemms() for _ in range(n)], device) / n
        t_adam = adamw_pass([p.detach() for ps, _, _ in opt.groups for p in ps], device)
        per_step[b] = t_step
        print(f"(f) one step, {heads} heads, K = {k}, D = {d}, B = {b} on {device}: {t_step * 1e3:.2f} ms; bare "
              f"products {t_gemm * 1e3:.2f} ms, one fused AdamW pass {t_adam * 1e3:.2f} ms")
        print(f"B={b} step/(gemm+adamw)={t_step / (t_gemm + t_adam):.2f}")
    return per_step[args.step_batches[0]]


def comparison(args: argparse.Namespace, device: torch.device) -> None:
    """(g): the 5-method comparison end to end: ``mr2probe train`` (3 seeds + the null control, default settings)
    on a feature file of N × 512 (float16), K classes, that this part writes first (not timed)."""
    import subprocess
    import sys

    from mr2probe.featurestore import FeatureWriter, base_attrs

    n, d, k = args.rows, 512, args.classes
    g = torch.Generator(device="cpu").manual_seed(0)
    means = torch.randn(k, d, generator=g)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "imagenet-like.h5"
        w = FeatureWriter(path, base_attrs("synthetic-512", "imagenet-like", [f"c{i}" for i in range(k)]), d)
        for split, rows in (("train", n), ("val", 10 * k), ("test", 50 * k)):
            w.begin(split, rows)
            for i in range(0, rows, 65536):
                y = torch.arange(i, min(i + 65536, rows)) % k
                x = means[y] + 2 * torch.randn(len(y), d, generator=g)
                w.write(split, i, x.half().numpy(), y.numpy(), y.numpy())
            w.end(split)
        w.finalize()
        cmd = [sys.executable, "-m", "mr2probe", "train", "--features", str(path), "--methods",
               ",".join(args.five), "--seeds", "3", "--out", str(Path(tmp) / "run"), "-q",
               "--device", str(device), *args.train_flags]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        t = time.perf_counter() - t0
        if done.returncode:
            raise RuntimeError(f"mr2probe train failed: {done.stderr.strip()[-400:]}")
    print(f"(g) the 5-method comparison ({', '.join(args.five)}; 3 seeds + null control) end to end on "
          f"{device}, N = {n} × {d}, K = {k}, {' '.join(args.train_flags) or 'default settings'}: {t:.1f} s")
    print(f"comparison_seconds={t:.1f}")


def projection(per_unit: float, halving: float) -> None:
    """(c): Σ over the paper's cells of budget steps × B·D·H·K × (b)'s seconds per unit; under halving × (b)'s
    halving/full wall time."""
    methods = [m for m in METHODS.names() if not METHODS.get(m).needs_adapter]
    total = 0.0
    for head in ("linear", "cosine"):
        cfg = TrainConfig(probe=ProbeConfig(head=head))
        heads, null_heads = len(expand_runs(methods, [0], cfg)), len(expand_runs(["ce"], [0], cfg))
        for n, k in PAPER_DATASETS.values():
            epochs, per_epoch = budget(n, cfg)
            for d in PAPER_ENCODER_DIMS.values():
                total += epochs * per_epoch * cfg.batch_size * d * k * 3 * (heads + null_heads) * per_unit
    print(f"(c) projected training time of the paper's grid (7 datasets × 3 encoders × 2 heads × 3 seeds + null "
          f"control, budget max(30 epochs, 1000 steps), from (b)'s rate; extraction not included): "
          f"{total / 3600:.2f} h")
    print(f"paper_grid_hours={total / 3600:.3f}")
    print(f"paper_grid_hours_halving={total * halving / 3600:.3f}")


def projection_b512(per_step: float, args: argparse.Namespace, halving: float) -> None:
    """(c′): the paper's grid from (f)'s measured step at B = 512 (the paper's batch), scaled per cell by
    D·H·K against (f)'s stack (the step's products and passes scale with them; its fixed costs are counted at the
    measured shape, which a smaller cell does not shrink below)."""
    methods = [m for m in METHODS.names() if not METHODS.get(m).needs_adapter]
    ref = 768 * len(expand_runs(methods, [0], TrainConfig())) * args.classes
    total = 0.0
    for head in ("linear", "cosine"):
        cfg = TrainConfig(probe=ProbeConfig(head=head))
        heads = len(expand_runs(methods, [0], cfg)) + len(expand_runs(["ce"], [0], cfg))
        for n, k in PAPER_DATASETS.values():
            epochs, per_epoch = budget(n, cfg)
            for d in PAPER_ENCODER_DIMS.values():
                total += epochs * per_epoch * 3 * per_step * max(d * heads * k / ref, 1.0)
    print(f"(c′) the paper's grid projected from (f)'s B = 512 step: {total / 3600:.2f} h, with halving "
          f"{total * halving / 3600:.2f} h")
    print(f"paper_grid_hours_b512={total / 3600:.3f}")
    print(f"paper_grid_hours_b512_halving={total * halving / 3600:.3f}")


def mr2_step(device: torch.device) -> None:
    """(d): benchmarks/speed_mr2_loss.py's MR2 and CE steps, alternated five times, medians."""
    from speed_mr2_loss import median_steps

    for k in (100, 1000):
        x, y = torch.randn(512, 768, device=device), torch.randint(0, k, (512,), device=device)
        ce_t, mr2_t = median_steps(x, y, k, 20, 5)
        print(f"(d) K={k}, B = 512, D = 768 on {device}: ce step {ce_t * 1e3:.2f} ms, mr2 step {mr2_t * 1e3:.2f} ms")
        print(f"K={k} mr2/ce={mr2_t / ce_t:.2f}")


def same_on_cpu(device: torch.device) -> None:
    """(e): one experiment on the device and on the CPU; the chosen heads' test accuracies side by side."""
    from mr2probe.experiment import config_from_settings, run_experiment

    feats = Path(__file__).resolve().parent.parent / "mr2probe" / "data" / "fmnist-effl0-small.h5"
    methods = ["ce", "mr2", "focal", "logit_adjust"]
    acc = {}
    with tempfile.TemporaryDirectory() as tmp:
        for dev in dict.fromkeys((device.type, "cpu")):
            cfg = config_from_settings(feats, Path(tmp) / dev, methods, [0], progress=False,
                                       values={"search": "halving", "device": dev})
            t0 = time.perf_counter()
            res = run_experiment(cfg)
            acc[dev] = {r["method"]: 100 * r["test_acc"] for r in res["runs"]}
            print(f"(e) {feats.name} on {dev}: {time.perf_counter() - t0:.1f} s, test acc "
                  + ", ".join(f"{m} {a:.2f}" for m, a in acc[dev].items()))
    diff = max(abs(acc[device.type][m] - acc["cpu"][m]) for m in acc["cpu"])
    print(f"device_vs_cpu_max_abs_delta_acc={diff:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (the default without CUDA)")
    args = ap.parse_args()
    gpu = torch.cuda.is_available() and not args.smoke
    device = torch.device("cuda" if gpu else "cpu")
    args.five = ["ce", "mr2", "logit_adjust", "group_dro", "class_balanced"]  # 28 heads
    args.halving = 1.0  # (b) measures it; the projections use 1 if (b) failed
    args.methods = [m for m in METHODS.names() if not METHODS.get(m).needs_adapter]
    if gpu:
        args.encoder, args.images, args.batch_size, args.workers = "timm:vit_base_patch16_224@random", 2048, 256, 8
        args.rows, args.classes, args.sweep_batch, args.steps = 1_281_167, 1000, 4096, 50
        args.step_batches, args.step_repeats, args.train_flags = [512, 4096], 20, []
        torch.backends.cuda.matmul.allow_tf32 = True
        print(f"GPU check on {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    else:
        args.encoder, args.images, args.batch_size, args.workers = "timm:resnet18@random", 24, 12, 0
        args.rows, args.classes, args.sweep_batch, args.steps = 4096, 100, 256, 4
        args.step_batches, args.step_repeats = [64, 256], 2
        args.train_flags = ["--epochs", "1", "--min-steps", "0", "--lr", "1e-2", "--wd", "1e-4"]
        print(f"no GPU (or --smoke): the smoke version on the CPU, tiny sizes; torch {torch.__version__}, "
              f"{torch.get_num_threads()} threads — these figures do not describe a GPU")
    t0 = time.perf_counter()
    failed = [name for name, part in (("extraction", lambda: extraction(args, device)),
                                      ("sweep", lambda: projection(*sweep(args, device))),
                                      ("steps", lambda: projection_b512(step_times(args, device), args,
                                                                        args.halving)),
                                      ("comparison", lambda: comparison(args, device)),
                                      ("mr2 step", lambda: mr2_step(device)),
                                      ("device vs cpu", lambda: same_on_cpu(device))) if not run_part(name, part)]
    print(f"gpu_check: done in {time.perf_counter() - t0:.0f} s ({'GPU' if gpu else 'CPU smoke'})"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    raise SystemExit(1 if failed else 0)


def run_part(name: str, part) -> bool:
    """Run one part; on an error print it and go on (one prepared run should report every part it can)."""
    try:
        part()
        return True
    except Exception:  # noqa: BLE001 — reported, and the exit status says so
        print(f"gpu_check: part {name!r} failed:\n{traceback.format_exc()}", flush=True)
        return False


if __name__ == "__main__":
    main()
