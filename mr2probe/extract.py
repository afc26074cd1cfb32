"""The extraction engine: a frozen encoder over an image dataset → a feature file (resumable, multi-process).

Rows are written in dataset order into ``<out>.partial`` in chunks; each split records how many rows are
written, so rerunning the same command resumes there. Under ``torchrun`` every split is processed in rounds
of ``world_size × batch_size`` rows: rank r encodes the r-th block of the round, rank 0 gathers the blocks
(gloo/NCCL) and writes them in order. We copy into one file (rather than an HDF5 virtual dataset over
per-rank files) so the result is a single self-contained file that is byte-for-byte the layout a
single-process run writes, and resume stays a single prefix per split.

Robustness: one writer per output (a POSIX lock that dies with its process, taken before anything slow);
SIGINT/SIGTERM are turned into ``KeyboardInterrupt`` but held back while a write is in flight, so the
``.partial`` is always consistent; a SIGKILL at any instant is recovered on the next run (see
:class:`FeatureWriter`); under torchrun every decision rank 0 takes alone (output kept, lock refused, settings
mismatch) reaches all ranks, so none hangs.

Preprocessing (``preprocess``): with "device" (the default) and a CUDA encoder the DataLoader workers only read
each image's file (and decode it to uint8 pixels unless it is a JPEG); the main process decodes the JPEGs on the
device (nvJPEG, batched), resizes, crops and normalises the batch there (:func:`preprocess_uint8`, one call per
image size) and encodes it. With a CPU encoder the workers decode and run the same tensor preprocessing on each
batch (the CPU is then the device, and the workers keep it off the encoder's process). With "workers" they run
the encoder's PIL transform per image as before (bit-for-bit the features of files written that way). The stored
``preprocessing`` attribute records the pipeline (``"preprocess": "device"``, ``"jpeg_decoder": "nvjpeg"`` on
CUDA), so a ``.partial`` is resumed only by the pipeline that began it.

Rank 0 buffers encoded rows and writes whole chunks (see :class:`_RowBuffer`); env ``MR2PROBE_FLUSH_SECONDS``
(default 5, 0 = every batch) bounds how much work a SIGKILL can lose on a slow run. Ctrl-C writes the buffer.

Test-only hook: env ``MR2PROBE_TEST_SLEEP_PER_BATCH=SECONDS`` sleeps after every round (to make interruption
tests deterministic); never set it for real runs.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import signal
import threading
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from PIL import Image

from .datasets import ImageDataset, ImageSplit, build_dataset
from .datasets._decode import as_byte_tensor, decode_jpegs, decode_rgb, is_jpeg
from .datasets._torchvision import one_line
from .encoders import Encoder, build_encoder, cpu_runtime
from .encoders.readout import check_readout, readout_suffix
from .distributed import init_distributed, local_device, rank_world
from .errors import UserError
from .featurestore import SPLITS, FeatureWriter, base_attrs, partial_path, read_features
from .progress import progress_bar
from .settings import EXTRACT, PREPROCESS, check_all

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
    # the defaults of the extraction settings are theirs (mr2probe.settings.EXTRACT, declared once)
    batch_size: int = EXTRACT["batch_size"].default
    workers: int = EXTRACT["workers"].default  # -1: min(8, cpus - 1)
    dtype: str = EXTRACT["dtype"].default
    amp: str = EXTRACT["amp"].default  # autocast dtype on CUDA; ignored on CPU
    runtime: str = EXTRACT["runtime"].default  # CPU only: "onnx" runs torch encoders through onnxruntime
    per_class: int | None = EXTRACT["per_class"].default  # stratified subset: at most this many per class and split
    splits: tuple[str, ...] = SPLITS
    overwrite: bool = False
    device: str | None = EXTRACT["device"].default
    progress: bool = True
    checksum: bool = True  # fletcher32 on every dataset: damaged chunks are detected on read
    preprocess: str = EXTRACT["preprocess"].default  # see PREPROCESS
    pool: str | None = EXTRACT["pool"].default  # ViT token readout (encoders.readout); None: the encoder's own
    blocks: int | None = EXTRACT["blocks"].default  # the readout over the last N blocks (None: 1)
    say: Callable[[str], None] | None = None  # rank 0's one-line notes (resumed, kept, wrote); None: silent


WORKER_OUTPUTS = ("transformed", "pixels", "preprocessed", "jpeg")


class _Images(Dataset):
    """Dataset positions → ((kind, image), label, position), what a DataLoader worker hands over per image, and
    :meth:`collate`, how it hands over a batch.

    ``output`` "transformed": the encoder's PIL transform (kind "float", the old pipeline); "pixels": uint8 RGB
    [3, H, W] (kind "uint8"); "preprocessed": "pixels", and the batch preprocessed by :meth:`Encoder.preprocess`
    in the worker (for a CPU encoder: the same tensor kernels as on CUDA, in parallel with the encoder); "jpeg": a
    JPEG file's bytes, undecoded (kind "jpeg", 1-D uint8), other images as "pixels". An unreadable image comes
    back as kind "error" with its one-line message (raised by the main process: an exception raised in a worker
    reaches the user wrapped in the worker's traceback)."""

    def __init__(self, split: ImageSplit, positions: np.ndarray, encoder: Encoder, output: str = "pixels") -> None:
        if output not in WORKER_OUTPUTS:
            raise ValueError(f"output must be one of {WORKER_OUTPUTS}, got {output!r}")
        self.split, self.positions, self.encoder, self.output = split, positions, encoder, output

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, i: int) -> tuple[tuple[str, Any], int, int]:
        pos = int(self.positions[i])
        try:
            item = self._read(pos)
        except UserError as e:
            item = ("error", str(e))
        except (OSError, Image.DecompressionBombError) as e:  # a dataset's own loader (not one of our files)
            item = ("error", f"cannot read image {pos} of the split: {one_line(e)}")
        return item, int(self.split.labels[pos]), pos

    def collate(self, samples: list[tuple[tuple[str, Any], int, int]]) -> _Batch:
        """The DataLoader's ``collate_fn``: :func:`_collate`, preprocessing the batch for "preprocessed"."""
        return _collate(samples, self.encoder if self.output == "preprocessed" else None)

    def _read(self, pos: int) -> tuple[str, torch.Tensor]:
        if self.output == "transformed":
            return "float", self.encoder.transform(self.split.image(pos))
        data = self.split.raw(pos)
        if data is None:
            return "uint8", self.split.pixels(pos)
        if self.output == "jpeg" and is_jpeg(data):
            return "jpeg", as_byte_tensor(data)
        return "uint8", decode_rgb(data, self.split.file(pos))


@dataclass
class _Batch:
    """One DataLoader batch: labels, positions, and its images stacked by kind and size (``groups``, with the
    batch ``rows`` each holds) or, JPEGs left for the device to decode, as bytes (``jpegs`` at ``jpeg_rows``).
    ``error``: the first unreadable image's message (the batch is then not usable)."""

    labels: torch.Tensor
    pos: torch.Tensor
    groups: list[torch.Tensor]
    rows: list[list[int]]
    jpegs: list[torch.Tensor]
    jpeg_rows: list[int]
    error: str | None = None

    def pin_memory(self) -> "_Batch":
        """Called by a pinning DataLoader: pin the decoded images (nvJPEG reads the JPEG bytes from the host)."""
        self.groups = [g.pin_memory() for g in self.groups]
        return self


def _collate(samples: list[tuple[tuple[str, Any], int, int]], encoder: Encoder | None = None) -> _Batch:
    """Stack the images of each kind and size (in a worker: the main process gets a few tensors per batch); with
    ``encoder``, preprocess them into one float tensor in batch order."""
    labels = torch.tensor([s[1] for s in samples], dtype=torch.int64)
    pos = torch.tensor([s[2] for s in samples], dtype=torch.int64)
    errors = [item[1] for item, _, _ in samples if item[0] == "error"]
    if errors:
        return _Batch(labels, pos, [], [], [], [], error=errors[0])
    shapes: dict[tuple, list[int]] = {}
    jpegs, jpeg_rows = [], []
    for row, ((kind, image), _, _) in enumerate(samples):
        if kind == "jpeg":
            jpegs.append(image)
            jpeg_rows.append(row)
        else:
            shapes.setdefault((kind, *image.shape), []).append(row)
    groups = [torch.stack([samples[r][0][1] for r in rows]) for rows in shapes.values()]
    rows = list(shapes.values())
    if encoder is not None and groups:
        groups, rows = [_in_order(encoder.preprocess(groups), rows)], [list(range(len(samples)))]
    return _Batch(labels, pos, groups, rows, jpegs, jpeg_rows)


def _in_order(x: torch.Tensor, rows: list[list[int]]) -> torch.Tensor:
    """``x``'s rows (the groups' rows one after the other) put back at their batch ``rows``."""
    order = [r for members in rows for r in members]
    if order == list(range(len(order))):
        return x
    out = torch.empty_like(x)
    out[torch.tensor(order, device=x.device)] = x
    return out


def _decode_on_device(batch: _Batch, split: ImageSplit, device: torch.device) -> list[torch.Tensor]:
    """The batch's JPEGs decoded on ``device`` together; if that fails, one by one, and one the device cannot
    decode (e.g. a format nvJPEG lacks) on the CPU, which names a corrupt file in a one-line error."""
    try:
        return decode_jpegs(batch.jpegs, device)
    except RuntimeError:
        pass
    out = []
    for data, row in zip(batch.jpegs, batch.jpeg_rows):
        try:
            out.append(decode_jpegs([data], device)[0])
        except RuntimeError:
            pos = int(batch.pos[row])
            out.append(decode_rgb(data.numpy().tobytes(), split.file(pos)).to(device))
    return out


def batch_on_device(batch: _Batch, encoder: Encoder, split: ImageSplit) -> torch.Tensor:
    """The encoder's input for one batch, on its device, rows in batch order: JPEGs decoded there, images
    grouped by size and preprocessed there (:meth:`Encoder.preprocess`); "transformed" batches only moved."""
    if batch.error is not None:
        raise UserError(batch.error)
    device = encoder.device
    groups = [g.to(device, non_blocking=True) for g in batch.groups]
    rows = list(batch.rows)
    if batch.jpegs:
        by_shape: dict[tuple, list[int]] = {}
        decoded = _decode_on_device(batch, split, device)
        for i, image in enumerate(decoded):
            by_shape.setdefault(tuple(image.shape), []).append(i)
        groups += [torch.stack([decoded[i] for i in members]) for members in by_shape.values()]
        rows += [[batch.jpeg_rows[i] for i in members] for members in by_shape.values()]
    if groups[0].is_floating_point():  # already preprocessed by the workers
        return _in_order(torch.cat(groups) if len(groups) > 1 else groups[0], rows)
    return _in_order(encoder.preprocess(groups), rows)


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
    return rank_world()


def pick_device(device: str | None) -> torch.device:
    return torch.device(device) if device else local_device()


_HELD: set[str] = set()  # output locks this process holds (a POSIX lock never conflicts with its own process)


@contextlib.contextmanager
def output_lock(out: Path) -> Iterator[None]:
    """One writer per output: a POSIX record lock (``fcntl.lockf``) on ``<out>.lock``.

    Unlike ``flock``, a POSIX lock belongs to the process that took it: forked children (DataLoader workers) do
    not inherit it, so it dies with that process even while orphaned workers linger, and a rerun right after a
    ``kill -9`` resumes at once; a live writer is still refused. The lock file is removed on release; an
    acquirer re-checks that the file it locked is still the one at the path (else a process that opened it just
    before the removal and one that creates it anew could both hold "the" lock)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    path = str(out) + ".lock"
    refused = UserError(f"another process is already writing {out} (lock {path} is held); wait for it to finish")
    if os.path.abspath(path) in _HELD:
        raise refused
    while True:
        lock = open(path, "a")
        try:
            fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            lock.close()
            if e.errno in (errno.EACCES, errno.EAGAIN):
                raise refused from None
            raise
        try:
            same = os.stat(path).st_ino == os.fstat(lock.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        lock.close()  # removed by the previous holder while we waited on it: lock the new one
    _HELD.add(os.path.abspath(path))
    try:
        yield
    finally:
        _HELD.discard(os.path.abspath(path))
        with contextlib.suppress(OSError):
            os.unlink(path)
        fcntl.lockf(lock, fcntl.LOCK_UN)
        lock.close()


class _Interrupts:
    """SIGINT/SIGTERM → ``KeyboardInterrupt``, deferred while inside :meth:`critical` (a write in flight).

    Installed only in the main thread, and not over a signal that was ignored (e.g. SIGINT of a job started
    with ``&`` or nohup)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.depth, self.pending, self.saved = 0, False, {}

    def __enter__(self) -> "_Interrupts":
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                old = signal.getsignal(sig)
                if old is not signal.SIG_IGN and old is not None:
                    self.saved[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self.saved.items():
            signal.signal(sig, old)
        self.saved.clear()

    def _handle(self, signum: int, frame: object) -> None:
        if self.depth:
            self.pending = True
            return
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def critical(self) -> Iterator[None]:
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
        if not self.depth and self.pending:
            self.pending = False
            raise KeyboardInterrupt


def _interrupt_on_sigterm(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: SIGTERM ends a worker the way Ctrl-C does (torch's worker loop exits
    quietly on ``KeyboardInterrupt``), so a SIGTERM to the whole process group (``kill -- -PGID``, ``pkill``)
    stops an extraction with the one-line resume message, not a "worker killed" traceback."""
    signal.signal(signal.SIGTERM, _raise_interrupt)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _worker_stopped(e: RuntimeError) -> bool:
    """torch's error for a DataLoader worker that died or exited (e.g. killed from outside)."""
    return "DataLoader worker" in str(e)


def _next_batch(batches: Iterator) -> Any:
    """``next(batches)``, with a data-loading worker that was stopped from outside seen as an interruption
    (raised here, between writes, so the rows already encoded are still written)."""
    try:
        return next(batches)
    except RuntimeError as e:
        if _worker_stopped(e):
            raise KeyboardInterrupt from None
        raise


def _on_rank0(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on rank 0 only; its ``UserError`` is raised on every rank (so no rank waits forever in a
    collective for a rank 0 that has given up). Returns ``fn()`` on rank 0, None elsewhere."""
    rank, world = _dist()
    if world == 1:
        return fn()
    result, error = None, None
    if rank == 0:
        try:
            result = fn()
        except UserError as e:
            error = e
    box = [None if error is None else str(error)]
    dist.broadcast_object_list(box, src=0)
    if error is not None:
        raise error
    if box[0] is not None:
        raise UserError(box[0])
    return result


def _share(value: Any) -> Any:
    """Rank 0's ``value`` on every rank."""
    if _dist()[1] == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


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
    if n >= 0:
        return n
    per_node = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))  # torchrun: share the CPUs between ranks
    return max(0, min(8, (os.cpu_count() or 1) // per_node - 1))


class _RowBuffer:
    """Rank 0's encoded rows not yet written. They are written at the split's chunk boundaries (whole chunks:
    no read-modify-write, few flushes), after ``seconds`` without a write (bounds what a SIGKILL loses on a
    slow run; env ``MR2PROBE_FLUSH_SECONDS``, default 5, 0 = every batch), at the end of the split, and on
    Ctrl-C. A write and the bookkeeping after it form one critical section (no interrupt in between)."""

    def __init__(self, writer: FeatureWriter, split: str, seconds: float, critical: Callable, skip: int = 0) -> None:
        self.writer, self.split, self.seconds, self.critical = writer, split, seconds, critical
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.rows, self.last, self.skip = 0, time.monotonic(), skip
        self.chunk = writer.chunk_rows_of(split)

    def add(self, feats: np.ndarray, labels: np.ndarray, index: np.ndarray) -> None:
        if self.skip:  # rows re-encoded only to keep batches aligned: already written
            k = min(self.skip, len(labels))
            feats, labels, index, self.skip = feats[k:], labels[k:], index[k:], self.skip - k
        if len(labels):
            with self.critical():
                self.parts.append((feats, labels, index))
                self.rows += len(labels)
        start = self.writer.rows_written(self.split)
        boundary = (start + self.rows) // self.chunk * self.chunk if self.chunk else 0
        if boundary > start:
            self.flush(boundary - start)
        elif self.rows and time.monotonic() - self.last >= self.seconds:
            self.flush()

    def flush(self, rows: int | None = None) -> None:
        if not self.rows:
            return
        with self.critical():
            feats, labels, index = (np.concatenate(a) for a in zip(*self.parts))
            k = self.rows if rows is None else rows
            self.writer.write(self.split, self.writer.rows_written(self.split), feats[:k], labels[:k], index[:k])
            self.parts = [(feats[k:], labels[k:], index[k:])] if k < self.rows else []
            self.rows -= k
            self.last = time.monotonic()


def worker_output(preprocess: str, device: torch.device) -> str:
    """What the DataLoader workers produce (see :class:`_Images`) for a ``preprocess`` setting and device."""
    if preprocess == "workers":
        return "transformed"
    return "jpeg" if device.type == "cuda" else "preprocessed"


def pipeline_attrs(preprocess: str, device: torch.device) -> dict[str, str]:
    """What the stored ``preprocessing`` attribute adds to the encoder's description for this pipeline (nothing
    for "workers": files written by the PIL pipeline keep their attribute and resume under it)."""
    if preprocess == "workers":
        return {}
    return {"preprocess": "device", **({"jpeg_decoder": "nvjpeg"} if device.type == "cuda" else {})}


def extract_split(encoder: Encoder, split: ImageSplit, positions: np.ndarray, writer: FeatureWriter | None,
                  name: str, cfg: ExtractConfig, start: int, interrupts: _Interrupts | None = None,
                  skip: int = 0) -> None:
    """Encode ``positions[start:]`` of one split and write them (rank 0) in dataset order, except the first
    ``skip`` rows (already written)."""
    rank, world = _dist()
    n = len(positions)
    blocks = _round_blocks(start, n, cfg.batch_size, world, rank)
    if not blocks:
        return
    critical = interrupts.critical if interrupts is not None else contextlib.nullcontext
    pause = float(os.environ.get("MR2PROBE_TEST_SLEEP_PER_BATCH", "0") or 0)  # test-only, see module doc
    mine = np.concatenate([positions[lo:hi] for lo, hi in blocks])
    images = _Images(split, mine, encoder, worker_output(cfg.preprocess, encoder.device))
    loader = DataLoader(images, batch_size=cfg.batch_size, shuffle=False, collate_fn=images.collate,
                        num_workers=_workers(cfg.workers) if len(mine) else 0,
                        pin_memory=encoder.device.type == "cuda", worker_init_fn=_interrupt_on_sigterm)
    buffer = None
    if rank == 0:
        buffer = _RowBuffer(writer, name, float(os.environ.get("MR2PROBE_FLUSH_SECONDS", "5") or 0), critical,
                            skip)
    batches = iter(loader)
    try:
        with progress_bar(f"extract {name}", total=n, completed=start, enabled=cfg.progress and rank == 0) as bar:
            for lo, hi in blocks:
                if hi > lo:
                    batch = _next_batch(batches)
                    feats = encoder.encode(batch_on_device(batch, encoder, split)).cpu().numpy()
                    block = (feats, batch.labels.numpy(), batch.pos.numpy())
                else:
                    empty = np.zeros(0, np.int64)
                    block = (np.zeros((0, encoder.config.dim), np.float32), empty, empty)
                parts = _gather(block, world)
                if buffer is not None:
                    buffer.add(*(np.concatenate([p[i] for p in parts]) for i in range(3)))
                    bar.advance(sum(len(p[1]) for p in parts))
                if pause:
                    time.sleep(pause)
        if buffer is not None:
            buffer.flush()
    except KeyboardInterrupt:
        if buffer is not None:
            buffer.flush()  # keep every row already encoded
        raise
    except RuntimeError as e:
        # torch's SIGCHLD handler raises this anywhere, even inside a write: drop the buffered rows (the
        # .partial holds whole, checked writes only) and stop as interrupted
        if not _worker_stopped(e):
            raise
        raise KeyboardInterrupt from None


def split_sources(dataset: str, name: str, split: ImageSplit, positions: np.ndarray,
                  root: str | Path | None) -> list[str]:
    """Each row's source, stored with its features: a WebDataset sample's key (a tar member's path up to the first
    dot of its file name), an image file's path relative to the dataset ``root`` (as the dataset names it without
    one), else ``"dataset:split:index"`` (images held in memory, e.g. a torchvision set)."""
    if split.file is None:
        return [f"{dataset}:{name}:{int(p)}" for p in positions]
    out = []
    for p in positions:
        path = str(split.file(int(p)))
        if split.read is not None:  # a member of a tar shard, named "SHARD:MEMBER"
            folder, _, base = path.rsplit(":", 1)[-1].rpartition("/")
            out.append(f"{folder}/{base.partition('.')[0]}" if folder else base.partition(".")[0])
        else:
            out.append(Path(os.path.relpath(path, root) if root is not None else path).as_posix())
    return out


def _keep_existing(out: Path, cfg: ExtractConfig) -> bool:
    """True when a finished ``out`` is there to keep (validated; it must not contradict the settings given)."""
    if cfg.overwrite or not out.exists():
        return False
    try:
        fs = read_features(out, load=False)
    except UserError as e:
        raise UserError(f"{e} (it is the output of this extraction: pass --overwrite to recompute it)") from None
    diff = []
    if "feature_dtype" in fs.attrs:  # written by mr2probe: it records the settings that shape the rows
        for key, want in (("feature_dtype", cfg.dtype), ("subset", _subset(cfg))):
            if fs.attrs.get(key) != want:
                diff.append(f"{key}: {fs.attrs.get(key)!r} there, {want!r} now")
        there, want_readout = _readout_of(fs.attrs.get("readout")), _readout_of(cfg)
        if there != want_readout:
            diff.append(f"readout: {there or 'the encoder output'} there, {want_readout or 'the encoder output'} now")
    if diff:
        raise UserError(f"{out} already exists with other settings ({'; '.join(diff)}); pass --overwrite to "
                        "recompute it or choose another --out")
    return True


def _readout_of(source: ExtractConfig | str | None) -> str | None:
    """``"pool=P,blocks=N"`` of a config or of a file's ``readout`` attribute (JSON); None: no readout."""
    if isinstance(source, ExtractConfig):
        if source.pool is None and source.blocks is None:
            return None
        pool, blocks = source.pool or "cls", source.blocks or 1
    elif source:
        recorded = json.loads(source)
        pool, blocks = recorded.get("pool"), recorded.get("blocks")
    else:
        return None
    return f"pool={pool},blocks={blocks}"


def default_out(dataset: str, encoder: str, pool: str | None = None, blocks: int | None = None) -> Path:
    """``features/<dataset>-<encoder>[<readout>].h5``, the output when none is named (``/`` and the encoder's ``:``
    become ``_``; :func:`readout_suffix` tells readouts apart)."""
    enc = encoder.replace(":", "_").replace("/", "_")
    return Path("features") / f"{dataset.replace('/', '_')}-{enc}{readout_suffix(pool, blocks)}.h5"


def _subset(cfg: ExtractConfig) -> str | None:
    return None if cfg.per_class is None else f"stratified, at most {cfg.per_class} per class and split (seed 0)"


def _say_resumed(say: Callable[[str], None], split: str, start: int, rows: int, out: Path) -> None:
    """The line of a split that resumes (rows already written) or that was finished in the partial file."""
    if 0 < start < rows:
        say(f"resumed split {split} at row {start} of {rows} (from {partial_path(out)})")
    elif start and start == rows:
        say(f"kept split {split}: its {start} rows were finished in {partial_path(out)}")


def _check_config(cfg: ExtractConfig) -> None:
    """One-line UserErrors for settings out of range (what :data:`~mr2probe.settings.EXTRACT` declares), before
    anything is built or opened."""
    check_all(EXTRACT, {f.name: getattr(cfg, f.name) for f in fields(cfg)})
    check_readout(cfg.pool, cfg.blocks)


def extract(cfg: ExtractConfig) -> Path:
    """Run one extraction (resuming a matching ``.partial``); returns the finished file's path.

    A finished file already at ``cfg.out`` is kept (not recomputed) unless ``cfg.overwrite``."""
    out = Path(cfg.out)
    _check_config(cfg)
    rank, world = _dist()
    say = cfg.say if cfg.say is not None and rank == 0 else (lambda text: None)
    with contextlib.ExitStack() as stack, _Interrupts() as interrupts:

        def claim() -> bool:  # rank 0: keep a finished file, else take the lock (then look again: a
            if _keep_existing(out, cfg):  # writer that held it may just have finished)
                return True
            stack.enter_context(output_lock(out))
            return _keep_existing(out, cfg)

        if _share(_on_rank0(claim)):
            say(f"kept the finished file {out} (the same settings; pass --overwrite to recompute it)")
            return out
        data: ImageDataset = build_dataset(cfg.dataset, cfg.root, cfg.download)
        splits = [s for s in cfg.splits if s in data.splits]
        for s in ("train", "test"):
            if s not in splits:
                raise UserError(f"dataset {cfg.dataset!r} has no {s!r} split (a feature file needs train and test)")
        encoder = build_encoder(cfg.encoder, cfg.weights, cfg.pool, cfg.blocks)
        encoder = cpu_runtime(encoder.to(pick_device(cfg.device)), cfg.runtime)
        autocast = "off"
        if hasattr(encoder, "amp_dtype") and encoder.device.type == "cuda":
            encoder.amp_dtype = AMP_DTYPES[cfg.amp]  # bf16 by default; TorchEncoder also uses channels_last
            autocast = cfg.amp

        def open_writer() -> FeatureWriter:
            pre = dict(encoder.config.preprocessing(), **pipeline_attrs(cfg.preprocess, encoder.device))
            attrs = base_attrs(encoder.name, data.name, data.class_names, pre, encoder.weights_sha256)
            attrs["source"] = data.source
            attrs["autocast"] = autocast
            if encoder.readout:
                attrs["readout"] = json.dumps(encoder.readout, sort_keys=True)
            if cfg.per_class is not None:
                attrs["subset"] = _subset(cfg)
            with interrupts.critical():
                return FeatureWriter(out, attrs, encoder.config.dim, cfg.dtype, overwrite=cfg.overwrite,
                                     checksum=cfg.checksum)

        writer: FeatureWriter | None = _on_rank0(open_writer)
        if writer is not None:
            stack.callback(writer.close)
        for s in splits:
            split = data.splits[s]
            positions = stratified_positions(split.labels, cfg.per_class)

            def begin() -> int:
                with interrupts.critical():
                    start = writer.begin(s, len(positions), split_sources(data.name, s, split, positions, cfg.root))
                labels, index = writer.read_prefix(s, start)
                if not (np.array_equal(index, positions[:start])
                        and np.array_equal(labels, split.labels[positions[:start]])):
                    raise UserError(f"{writer.partial}: the rows already written in split {s!r} are not those "
                                    "of this dataset and subset (other data or settings); pass --overwrite to "
                                    "start over")
                return start

            start = _share(_on_rank0(begin))
            _say_resumed(say, s, start, len(positions), out)
            # resume on the batch grid (rows 0, b, 2b, ...): every batch is then the one an uninterrupted run
            # encodes, so results are bit-identical even where a kernel depends on the batch composition
            aligned = start - start % cfg.batch_size
            extract_split(encoder, split, positions, writer, s, cfg, aligned, interrupts, skip=start - aligned)
            if rank == 0:
                with interrupts.critical():
                    writer.end(s)
        if rank == 0:
            with interrupts.critical():
                writer.finalize()
    if world > 1:
        dist.barrier()
    say(f"wrote {out}")
    return out


__all__ = ["PREPROCESS", "ExtractConfig", "batch_on_device", "default_out", "extract", "init_distributed",
           "partial_path", "readout_suffix", "stratified_positions", "worker_output"]
