"""Extraction throughput against the encoder's bare forward pass, in one run.

Times ``mr2probe.extract.extract`` on a stratified Fashion-MNIST subset (``per_class`` = N / (2 splits × 10
classes)): dataset open, encoder build, decode, transform, DataLoader workers, forward and HDF5 writing. Then
times ``encoder.encode`` alone on the same batches (same positions, same batch size, preprocessed beforehand)
with the encoder built the same way (``cpu_runtime`` included). Prints images/s for both and ends with

    extract/forward=<ratio>      (whole extraction img/s ÷ forward-only img/s; 1.0 = no overhead)

Usage: ``python benchmarks/speed_extract.py [--encoder efficientnet-lite0] [--n 500] [--batch-size 64]``
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from mr2probe.datasets import build_dataset
from mr2probe.encoders import Encoder, build_encoder, cpu_runtime
from mr2probe.extract import ExtractConfig, extract, pick_device, stratified_positions


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--encoder", default="efficientnet-lite0", help="encoder name (see `mr2probe encoders`)")
    p.add_argument("--n", type=int, default=500, help="about this many images in all (train + test)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=-1, help="DataLoader workers for the extraction [-1: auto]")
    p.add_argument("--runtime", default="auto", choices=("auto", "torch", "onnx"), help="CPU runtime")
    p.add_argument("--device", default=None, help="torch device [cuda if available, else cpu]")
    p.add_argument("--weights", type=Path, default=None, help="encoder weights file")
    p.add_argument("--root", type=Path, default=None, help="Fashion-MNIST folder")
    return p.parse_args()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_extraction(args: argparse.Namespace, per_class: int, out: Path) -> float:
    """Seconds for one complete extraction (fresh output file, no progress bar)."""
    cfg = ExtractConfig(encoder=args.encoder, dataset="fashion-mnist", out=out, root=args.root, weights=args.weights,
                        batch_size=args.batch_size, workers=args.workers, runtime=args.runtime, per_class=per_class,
                        overwrite=True, progress=False, device=args.device)
    t0 = time.perf_counter()
    extract(cfg)
    return time.perf_counter() - t0


def time_forward(encoder: Encoder, batches: list[torch.Tensor]) -> float:
    """Seconds for ``encode`` over ``batches`` (already preprocessed); one untimed warm-up batch first."""
    encoder.encode(batches[0].to(encoder.device))
    _sync(encoder.device)
    t0 = time.perf_counter()
    for b in batches:
        encoder.encode(b.to(encoder.device))
    _sync(encoder.device)
    return time.perf_counter() - t0


def main() -> None:
    args = parse_args()
    data = build_dataset("fashion-mnist", args.root)
    splits = [s for s in ("train", "test") if s in data.splits]
    per_class = max(1, round(args.n / (len(splits) * len(data.class_names))))

    t0 = time.perf_counter()
    encoder = cpu_runtime(build_encoder(args.encoder, args.weights).to(pick_device(args.device)), args.runtime)
    build_s = time.perf_counter() - t0
    batches = []
    for s in splits:
        split = data.splits[s]
        pos = stratified_positions(split.labels, per_class)
        for lo in range(0, len(pos), args.batch_size):
            chunk = pos[lo:lo + args.batch_size]
            batches.append(torch.stack([encoder.transform(split.image(int(p))) for p in chunk]))
    n = sum(len(b) for b in batches)

    with tempfile.TemporaryDirectory() as tmp:
        extract_s = time_extraction(args, per_class, Path(tmp) / "bench.h5")
    forward_s = time_forward(encoder, batches)

    extract_ips, forward_ips = n / extract_s, n / forward_s
    runtime = encoder.preprocessing.get("runtime", "torch")
    print(f"encoder {encoder.name} ({runtime}, {encoder.device}), {n} images "
          f"({per_class} per class × {len(data.class_names)} classes × {len(splits)} splits), batch {args.batch_size}")
    print(f"encoder build (first, incl. any ONNX export): {build_s:.2f} s")
    print(f"extract (whole, incl. setup): {extract_s:.2f} s = {extract_ips:.1f} img/s")
    print(f"forward only:                 {forward_s:.2f} s = {forward_ips:.1f} img/s")
    print(f"extract/forward={extract_ips / forward_ips:.3f}")


if __name__ == "__main__":
    main()
