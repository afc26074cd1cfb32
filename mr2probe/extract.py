"""The extraction engine: a frozen encoder over an image dataset → a feature file (resumable, multi-process).

Rows are written in dataset order into ``<out>.partial`` in chunks; each split records how many rows are
written, so rerunning the same command resumes there. Under ``torchrun`` every split is processed in rounds
of ``world_size × batch_size`` rows: rank r encodes the r-th block of the round, rank 0 gathers the blocks
(gloo/NCCL) and writes them in order. We copy into one file (rather than an HDF5 virtual dataset over
per-rank files) so the result is a single self-contained file that is byte-for-byte the layout a
single-process run writes, and resume stays a single prefix per split.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from .datasets import ImageDataset, ImageSplit, build_dataset
from .encoders import Encoder, build_encoder, cpu_runtime
from .errors import UserError
from .featurestore import SPLITS, FeatureWriter, base_attrs, partial_path, read_features
from .progress import progress_bar

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "off": None}


@dataclass
class ExtractConfig:
    """Everything ``mr2probe extract`` takes (see ``mr2probe extract --help``)."""

    encoder: str
    dataset: str
    out: Path
    root: Path | None = None
    download: bool = False
    weights: Path | None = None
    batch_size: int = 64
    workers: int = -1  # -1: min(8, cpus - 1)
    dtype: str = "float16"
    amp: str = "bf16"  # autocast dtype on CUDA; ignored on CPU
    runtime: str = "auto"  # CPU only: "onnx" runs torch encoders through onnxruntime, "auto" = onnx if installed
    per_class: int | None = None  # stratified subset: at most this many samples per class and split
    splits: tuple[str, ...] = SPLITS
    overwrite: bool = False
    device: str | None = None
    progress: bool = True


class _Images(Dataset):
    """Dataset positions → (preprocessed image, label, position)."""

    def __init__(self, split: ImageSplit, positions: np.ndarray, encoder: Encoder) -> None:
        self.split, self.positions, self.encoder = split, positions, encoder

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        pos = int(self.positions[i])
        return self.encoder.transform(self.split.image(pos)), int(self.split.labels[pos]), pos


def stratified_positions(labels: np.ndarray, per_class: int | None, seed: int = 0) -> np.ndarray:
    """All positions, or a seeded stratified subset of at most ``per_class`` per class, in dataset order."""
    if per_class is None:
        return np.arange(len(labels), dtype=np.int64)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(labels))
    # rank of each sample within its class under the random order; keep the first per_class of each class
    sorted_idx = order[np.argsort(labels[order], kind="stable")]
    cls = labels[sorted_idx]
    starts = np.searchsorted(cls, cls, side="left")
    keep = sorted_idx[(np.arange(len(cls)) - starts) < per_class]
    return np.sort(keep).astype(np.int64)


def _dist() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_distributed() -> bool:
    """Join the torchrun process group when launched by torchrun (env WORLD_SIZE > 1)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        return True
    return False


def pick_device(device: str | None) -> torch.device:
    if device:
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


@contextlib.contextmanager
def output_lock(out: Path) -> Iterator[None]:
    """One writer per output: an flock on ``<out>.lock`` (released by the OS even if the process is killed)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    lock = open(str(out) + ".lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise UserError(f"another process is already writing {out} (lock {out}.lock); wait for it to finish")
    try:
        yield
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()


def _round_blocks(start: int, stop: int, batch: int, world: int, rank: int) -> list[tuple[int, int]]:
    """Per round of world×batch rows from ``start``: this rank's [lo, hi) block (may be empty at the end)."""
    blocks = []
    for r0 in range(start, stop, batch * world):
        lo = min(r0 + rank * batch, stop)
        blocks.append((lo, min(lo + batch, stop)))
    return blocks


def _gather(block: tuple[np.ndarray, np.ndarray, np.ndarray], world: int) -> list | None:
    if world == 1:
        return [block]
    rank = dist.get_rank()
    out = [None] * world if rank == 0 else None
    dist.gather_object(block, out, dst=0)
    return out


def _workers(n: int) -> int:
    return max(0, min(8, (os.cpu_count() or 1) - 1)) if n < 0 else n


def extract_split(encoder: Encoder, split: ImageSplit, positions: np.ndarray, writer: FeatureWriter | None,
                  name: str, cfg: ExtractConfig, start: int) -> None:
    """Encode ``positions[start:]`` of one split and write them (rank 0) in dataset order."""
    rank, world = _dist()
    n = len(positions)
    blocks = _round_blocks(start, n, cfg.batch_size, world, rank)
    mine = np.concatenate([positions[lo:hi] for lo, hi in blocks]) if blocks else np.zeros(0, np.int64)
    loader = DataLoader(_Images(split, mine, encoder), batch_size=cfg.batch_size, shuffle=False,
                        num_workers=_workers(cfg.workers), pin_memory=encoder.device.type == "cuda")
    batches = iter(loader)
    with progress_bar(f"extract {name}", total=n, completed=start, enabled=cfg.progress and rank == 0) as bar:
        for lo, hi in blocks:
            if hi > lo:
                images, labels, pos = next(batches)
                feats = encoder.encode(images.to(encoder.device, non_blocking=True)).cpu().numpy()
                block = (feats, labels.numpy().astype(np.int64), pos.numpy().astype(np.int64))
            else:
                block = (np.zeros((0, encoder.dim), np.float32), np.zeros(0, np.int64), np.zeros(0, np.int64))
            parts = _gather(block, world)
            if rank == 0:
                feats = np.concatenate([p[0] for p in parts])
                labels = np.concatenate([p[1] for p in parts])
                pos = np.concatenate([p[2] for p in parts])
                row = writer.rows_written(name)
                writer.write(name, row, feats, labels, pos)
                bar.advance(len(labels))


def extract(cfg: ExtractConfig) -> Path:
    """Run one extraction (resuming a matching ``.partial``); returns the finished file's path."""
    out = Path(cfg.out)
    if cfg.dtype not in ("float16", "float32"):
        raise UserError(f"--dtype must be float16 or float32, got {cfg.dtype!r}")
    if cfg.amp not in AMP_DTYPES:
        raise UserError(f"--amp must be one of {', '.join(AMP_DTYPES)}, got {cfg.amp!r}")
    if cfg.batch_size < 1:
        raise UserError(f"--batch-size must be ≥ 1, got {cfg.batch_size}")
    if cfg.per_class is not None and cfg.per_class < 1:
        raise UserError(f"--per-class must be ≥ 1, got {cfg.per_class}")
    rank, world = _dist()
    if rank == 0 and out.exists() and not cfg.overwrite:
        read_features(out, load=False)  # validates: a finished file is kept, a broken one reported
        return out
    data: ImageDataset = build_dataset(cfg.dataset, cfg.root, cfg.download)
    if cfg.runtime not in ("auto", "torch", "onnx"):
        raise UserError(f"--runtime must be auto, torch or onnx, got {cfg.runtime!r}")
    encoder = cpu_runtime(build_encoder(cfg.encoder, cfg.weights).to(pick_device(cfg.device)), cfg.runtime)
    if hasattr(encoder, "amp_dtype") and encoder.device.type == "cuda":
        encoder.amp_dtype = AMP_DTYPES[cfg.amp]
    splits = [s for s in cfg.splits if s in data.splits]
    for s in ("train", "test"):
        if s not in splits:
            raise UserError(f"dataset {cfg.dataset!r} has no {s!r} split (a feature file needs train and test)")
    lock = output_lock(out) if rank == 0 else contextlib.nullcontext()
    with lock:
        writer = None
        if rank == 0:
            attrs = base_attrs(encoder.name, data.name, data.class_names, encoder.preprocessing,
                               encoder.weights_sha256)
            attrs["source"] = data.source
            if cfg.per_class is not None:
                attrs["subset"] = f"stratified, at most {cfg.per_class} per class and split (seed 0)"
            writer = FeatureWriter(out, attrs, encoder.dim, cfg.dtype, overwrite=cfg.overwrite)
        try:
            for s in splits:
                split = data.splits[s]
                positions = stratified_positions(split.labels, cfg.per_class)
                start = writer.begin(s, len(positions)) if rank == 0 else 0
                if world > 1:
                    box = [start]
                    dist.broadcast_object_list(box, src=0)
                    start = box[0]
                extract_split(encoder, split, positions, writer, s, cfg, start)
                if rank == 0:
                    writer.end(s)
            if rank == 0:
                writer.finalize()
                Path(str(out) + ".lock").unlink(missing_ok=True)
        finally:
            if writer is not None:
                writer.close()
    if world > 1:
        dist.barrier()
    return out


__all__ = ["ExtractConfig", "extract", "init_distributed", "partial_path", "stratified_positions"]
