"""Where one stacked training step spends its time on a GPU, at the ImageNet shape (a tiny CPU version with --smoke).

(1) the stacked step: ``train_stack`` over every method without an adapter × its grid (one seed, H heads), batch B,
    D = 768, K = 1000, S steps → milliseconds per step;
(2) the profiler over the same stack: the kernels' time against the wall time (``busy``: below 1 the device
    waits for the host), and the kernels that take most of the device time;
(3) one elementwise pass over the step's logits [H, B, K] in float32 (``z.mul_(1)``: read and write once) →
    ``step/logit_pass``, the step in units of such passes (the step's memory traffic, if it is memory-bound);
(4) torch.compile on the part of the step that is elementwise: H stacked CE heads (logits → per-head mean CE →
    backward to the weights), eager against compiled (inductor), with the largest |Δ loss| → ``compiled/eager``;
    and the same in bf16 autocast (the logits in bf16) → ``bf16/eager``.
Usage: ``python benchmarks/gpu_step.py [--smoke] [--no-compile]``; every figure printed is measured in this run.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from mr2probe.methods import METHODS
from mr2probe.trainer import TrainConfig, TrainData, expand_runs, train_stack


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def per_call(fn, device: torch.device, repeats: int) -> float:
    """Seconds per call of ``fn`` (after one warm-up call)."""
    fn()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / repeats


def stack_step(args: argparse.Namespace, device: torch.device) -> tuple[float, int]:
    """(1) and (2); returns (seconds per step, heads)."""
    from torch.profiler import ProfilerActivity, profile

    b, d, k, steps = args.batch, args.dim, args.classes, args.steps
    g = torch.Generator().manual_seed(0)
    y = torch.arange(steps * b) % k
    x = (torch.randn(k, d, generator=g)[y] + 2 * torch.randn(len(y), d, generator=g)).to(device)
    y = y.to(device)
    data = TrainData(x, y, x[: 10 * k], y[: 10 * k], k)
    cfg = TrainConfig(epochs=1, batch_size=b, min_steps=0, progress=False, device=str(device))
    specs = expand_runs([m for m in METHODS.names() if not METHODS.get(m).needs_adapter], [0], cfg)
    short = TrainData(x[: 2 * b], y[: 2 * b], data.val_x, data.val_y, k)
    two = per_call(lambda: train_stack(short, specs, cfg), device, 2)  # set-up + 2 steps + evaluation
    whole = per_call(lambda: train_stack(data, specs, cfg), device, 1)
    step = (whole - two) / (steps - 2)
    print(f"(1) stacked step: {len(specs)} heads, B = {b}, D = {d}, K = {k}, {steps} steps on {device}: "
          f"{whole:.2f} s in all, {1e3 * step:.2f} ms per step (set-up and evaluation taken out)")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        train_stack(data, specs, cfg)
        sync(device)
    if device.type == "cuda":  # the kernels' own events (an op's row also carries its kernels' time)
        busy = sum(e.self_device_time_total for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA) / 1e6
        print(f"(2) profiler: kernels ran {busy:.2f} s of the stack's {whole:.2f} s wall: busy={busy / whole:.3f}")
    attr = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=attr, row_limit=args.rows))
    return step, len(specs)


def logit_pass(args: argparse.Namespace, device: torch.device, heads: int, step: float) -> None:
    """(3)."""
    z = torch.zeros(heads, args.batch, args.classes, device=device)
    t = per_call(lambda: z.mul_(1.0), device, 20)
    gb = 2 * z.numel() * 4 / 1e9
    print(f"(3) one pass over the logits [{heads}, {args.batch}, {args.classes}] float32: {1e3 * t:.3f} ms "
          f"({gb / t:.0f} GB/s read + write)")
    print(f"step/logit_pass={step / t:.1f}")


def compiled_ce(args: argparse.Namespace, device: torch.device, heads: int) -> None:
    """(4): H stacked CE heads, forward + backward to the weights: eager, compiled, bf16 autocast."""
    b, d, k = args.batch, args.dim, args.classes
    g = torch.Generator().manual_seed(1)
    x = torch.randn(b, d, generator=g).to(device)
    y = torch.randint(0, k, (b,), generator=g).to(device)
    w = (0.01 * torch.randn(heads, d, k, generator=g)).to(device).requires_grad_(True)

    def loss_fn(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = torch.einsum("bd,hdk->hbk", x, w)  # [H, B, K]
        return F.cross_entropy(logits.reshape(-1, k), y.repeat(heads), reduction="none").view(heads, b).mean(1).sum()

    def runner(fn, autocast: bool = False):
        def go() -> torch.Tensor:
            w.grad = None
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                loss = fn(w, x, y)
            loss.backward()
            return loss.detach()
        return go

    eager = runner(loss_fn)
    t_eager = per_call(eager, device, args.repeats)
    ref = eager().float()
    t0 = time.perf_counter()
    compiled = runner(torch.compile(loss_fn))
    compiled()
    sync(device)
    t_compile = time.perf_counter() - t0
    t_comp = per_call(compiled, device, args.repeats)
    diff = (compiled().float() - ref).abs().item()
    print(f"(4) {heads} CE heads, B = {b}, D = {d}, K = {k}, forward + backward on {device}: eager "
          f"{1e3 * t_eager:.2f} ms, compiled {1e3 * t_comp:.2f} ms (compiling took {t_compile:.1f} s; "
          f"|Δ loss| {diff:.2e})")
    print(f"compiled/eager={t_comp / t_eager:.3f}")
    bf16 = runner(loss_fn, autocast=True)
    t_bf16 = per_call(bf16, device, args.repeats)
    print(f"(4) the same in bf16 autocast: {1e3 * t_bf16:.2f} ms, |Δ loss| {(bf16().float() - ref).abs().item():.2e}")
    print(f"bf16/eager={t_bf16 / t_eager:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (the default without CUDA)")
    ap.add_argument("--no-compile", action="store_true", help="leave out (4)")
    args = ap.parse_args()
    gpu = torch.cuda.is_available() and not args.smoke
    device = torch.device("cuda" if gpu else "cpu")
    if gpu:
        args.batch, args.dim, args.classes, args.steps, args.repeats, args.rows = 4096, 768, 1000, 30, 10, 15
        torch.backends.cuda.matmul.allow_tf32 = True
        print(f"on {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    else:
        args.batch, args.dim, args.classes, args.steps, args.repeats, args.rows = 128, 64, 50, 8, 3, 8
        print(f"the smoke version on the CPU, tiny sizes; torch {torch.__version__} — these figures do not describe "
              f"a GPU")
    t0 = time.perf_counter()
    step, heads = stack_step(args, device)
    logit_pass(args, device, heads, step)
    if not args.no_compile:
        compiled_ce(args, device, heads)
    print(f"gpu_step: done in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
