"""Extraction throughput against the encoder's bare forward pass, in one run.

Times ``mr2probe.extract.extract`` on a stratified Fashion-MNIST subset (``per_class`` = N / (2 splits × 10
classes)): dataset open, encoder build, decode, transform, DataLoader workers, forward and HDF5 writing. Then
times ``encoder.encode`` alone on the same batches (same positions, same batch size, preprocessed beforehand)
with the encoder built the same way (``cpu_runtime`` included). Prints images/s for both and ends with

    extract/forward=<ratio>      (whole extraction img/s ÷ forward-only img/s; 1.0 = no overhead)

Usage: ``python benchmarks/speed_extract.py [--encoder efficientnet-lite0] [--n 500] [--batch-size 64]``

``--worker-cpu``: instead, the CPU work per image of what the DataLoader workers do (read, decode, collate into a
batch; ``time.process_time`` over whole batches, in this process, no workers), on the same image files (a class-folder
tree: ``--images DIR``, default foolbox's 100 sample images: 20 ImageNet JPEGs at 512 px, 80 PNGs of 28–32 px),
for each worker output of ``mr2probe.extract._Images``, interleaved in every one of ``--repeats`` repeats (medians):

    transformed   --preprocess workers: decode + the encoder's PIL transform (resize, crop, ToTensor, Normalize)
    jpeg          --preprocess device, CUDA encoder: JPEG bytes as read (nvJPEG decodes them), others decoded
    preprocessed  --preprocess device, CPU encoder: decode + the tensor preprocessing of each batch (uint8 resize)

and, on this CPU, the work the CUDA device takes over from the "jpeg" output (decode + ``Encoder.preprocess``:
on a GPU it runs there). It ends with ``worker_cpu_ms/<output>=…`` (all images, then the JPEGs alone) and the
ratios ``<output>/transformed=…``.

``--agreement``: the features of the same images through both pipelines with the encoder's weights: the largest
pixel difference after preprocessing (in intensity levels of 255), the cosine similarity of the features, and, for
EfficientNet-Lite, how many of its ImageNet classifier's predictions change.
"""
from __future__ import annotations

import argparse
import importlib.util
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from mr2probe.datasets import ImageSplit, build_dataset
from mr2probe.encoders import Encoder, build_encoder, cpu_runtime
from mr2probe.extract import ExtractConfig, _Images, extract, pick_device, stratified_positions


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--encoder", default="efficientnet-lite0", help="encoder name (see `mr2probe encoders`)")
    p.add_argument("--n", type=int, default=500, help="about this many images in all (train + test)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=-1, help="DataLoader workers for the extraction [-1: auto]")
    p.add_argument("--runtime", default="auto", choices=("auto", "torch", "onnx"), help="CPU runtime")
    p.add_argument("--preprocess", default="device,workers", help="extraction pipelines to time, comma-separated "
                   "(each against the same forward pass)")
    p.add_argument("--device", default=None, help="torch device [cuda if available, else cpu]")
    p.add_argument("--weights", type=Path, default=None, help="encoder weights file")
    p.add_argument("--root", type=Path, default=None, help="Fashion-MNIST folder")
    p.add_argument("--worker-cpu", action="store_true", help="CPU work per image of the workers' outputs instead")
    p.add_argument("--agreement", action="store_true", help="features through both pipelines instead")
    p.add_argument("--images", type=Path, default=None, help="class-folder tree for --worker-cpu / --agreement "
                   "[foolbox's sample images]")
    p.add_argument("--repeats", type=int, default=5, help="--worker-cpu: interleaved repeats (medians)")
    return p.parse_args()


def image_split(folder: Path | None, tmp: Path) -> ImageSplit:
    """Every image of a class-folder tree as one split (default: foolbox's samples copied into ``tmp``)."""
    if folder is None:
        spec = importlib.util.find_spec("foolbox")
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit("--images DIR is needed (or: pip install --no-deps foolbox, for its sample images)")
        folder = tmp / "foolbox"
        for f in sorted((Path(list(spec.submodule_search_locations)[0]) / "data").glob("*.*")):
            (folder / f.stem.split("_")[0]).mkdir(parents=True, exist_ok=True)
            shutil.copy(f, folder / f.stem.split("_")[0] / f.name)
    data = build_dataset("imagefolder", folder)
    whole = [s for s in data.splits.values()]
    labels = np.concatenate([s.labels for s in whole])
    index = [(s, i) for s in whole for i in range(len(s))]
    return ImageSplit(labels=labels, load=lambda i: index[i][0].load(index[i][1]),
                      file=lambda i: index[i][0].file(index[i][1]))


def worker_seconds(split: ImageSplit, positions: np.ndarray, encoder: Encoder, output: str, batch: int) -> float:
    """CPU seconds (this process) for the workers' job over ``positions``: every item, collated by batches."""
    images = _Images(split, positions, encoder, output)
    t0 = time.process_time()
    for lo in range(0, len(positions), batch):
        images.collate([images[i] for i in range(lo, min(lo + batch, len(positions)))])
    return time.process_time() - t0


def worker_cpu(args: argparse.Namespace) -> None:
    """Print the CPU work per image of each worker output (medians of interleaved repeats) and the ratios."""
    encoder = build_encoder(args.encoder, args.weights)
    outputs = ("transformed", "jpeg", "preprocessed")
    with tempfile.TemporaryDirectory() as tmp:
        split = image_split(args.images, Path(tmp))
        everything = np.arange(len(split))
        jpegs = np.array([i for i in everything if split.raw(i)[:3] == b"\xff\xd8\xff"], dtype=np.int64)
        sets = {"all": everything, "jpeg": jpegs}
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.repeats):
            for name, pos in sets.items():
                if len(pos):
                    for out in outputs:
                        times.setdefault((name, out), []).append(worker_seconds(split, pos, encoder, out,
                                                                                args.batch_size) / len(pos))
    ms = {k: 1000 * statistics.median(v) for k, v in times.items()}
    print(f"worker CPU work per image, {len(everything)} images ({len(jpegs)} JPEG) from "
          f"{args.images or 'foolbox sample images'}, preprocessing of {encoder.name} "
          f"(resize {encoder.preprocessing['resize']}, crop {encoder.preprocessing['crop']}, "
          f"{encoder.preprocessing.get('interpolation', 'bilinear')}), batch {args.batch_size}, "
          f"{torch.get_num_threads()} threads, median of {args.repeats} interleaved repeats")
    for name in sets:
        if (name, "jpeg") not in ms:
            continue
        print(f"[{name}] work the CUDA device takes over (decode + preprocess), here on this CPU: "
              f"{ms[name, 'preprocessed'] - ms[name, 'jpeg']:.3f} ms per image")
        for out in outputs:
            key = "" if name == "all" else "_jpeg"
            print(f"worker_cpu_ms{key}/{out}={ms[name, out]:.3f}")
        for out in outputs[1:]:
            key = "" if name == "all" else "_jpeg"
            print(f"{out}/transformed{key}={ms[name, out] / ms[name, 'transformed']:.3f}")


def agreement(args: argparse.Namespace) -> None:
    """Print how far the device pipeline's inputs and features are from the PIL pipeline's on the same images."""
    encoder = build_encoder(args.encoder, args.weights)
    with tempfile.TemporaryDirectory() as tmp:
        split = image_split(args.images, Path(tmp))
        old = torch.stack([encoder.transform(split.image(i)) for i in range(len(split))])
        new = encoder.preprocess([split.pixels(i)[None] for i in range(len(split))])
    std = torch.tensor(encoder.preprocessing["std"]).view(1, -1, 1, 1)
    levels = ((new - old).abs() * std * 255).amax(dim=(1, 2, 3))
    with torch.inference_mode():
        f_old, f_new = encoder.encode(old), encoder.encode(new)
    cos = torch.nn.functional.cosine_similarity(f_old, f_new)
    print(f"{encoder.name} on {len(split)} images from {args.images or 'foolbox sample images'}: "
          f"preprocessed inputs differ by at most {levels.max():.2f} intensity levels (mean of the per-image "
          f"maxima {levels.mean():.2f}; {(levels > 0).float().mean():.0%} of the images differ at all)")
    print(f"max_abs_input_diff_normalised={(new - old).abs().max():.5f}")
    print(f"feature_cosine_min={cos.min():.7f} mean={cos.mean():.7f}")
    if encoder.name.startswith("efficientnet-lite"):
        from mr2probe.encoders.efficientnet_lite import build_network

        fc = build_network(encoder.name, args.weights)[0]._fc
        with torch.inference_mode():
            changed = int((fc(f_old).argmax(1) != fc(f_new).argmax(1)).sum())
        print(f"imagenet_top1_changed={changed} of {len(split)}")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_extraction(args: argparse.Namespace, per_class: int, out: Path, preprocess: str = "device") -> float:
    """Seconds for one complete extraction (fresh output file, no progress bar)."""
    cfg = ExtractConfig(encoder=args.encoder, dataset="fashion-mnist", out=out, root=args.root, weights=args.weights,
                        batch_size=args.batch_size, workers=args.workers, runtime=args.runtime, per_class=per_class,
                        overwrite=True, progress=False, device=args.device, preprocess=preprocess)
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
    if args.worker_cpu or args.agreement:
        return worker_cpu(args) if args.worker_cpu else agreement(args)
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

    pipelines = [p.strip() for p in args.preprocess.split(",") if p.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        extract_s = {p: time_extraction(args, per_class, Path(tmp) / "bench.h5", p) for p in pipelines}
    forward_s = time_forward(encoder, batches)

    forward_ips = n / forward_s
    runtime = encoder.preprocessing.get("runtime", "torch")
    print(f"encoder {encoder.name} ({runtime}, {encoder.device}), {n} images "
          f"({per_class} per class × {len(data.class_names)} classes × {len(splits)} splits), batch {args.batch_size}")
    print(f"encoder build (first, incl. any ONNX export): {build_s:.2f} s")
    for p, seconds in extract_s.items():
        print(f"extract --preprocess {p} (whole, incl. setup): {seconds:.2f} s = {n / seconds:.1f} img/s")
    print(f"forward only:                 {forward_s:.2f} s = {forward_ips:.1f} img/s")
    for p, seconds in extract_s.items():
        print(f"extract/forward={n / seconds / forward_ips:.3f}" if p == "device" else
              f"extract[{p}]/forward={n / seconds / forward_ips:.3f}")


if __name__ == "__main__":
    main()
