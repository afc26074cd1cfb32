"""Features too large for memory: read from the HDF5 file in blocks, under a memory cap (``--max-memory``).

``mr2probe train`` loads train, val and test onto the training device when, as float32, they fit in the cap
(default 8 GiB); otherwise each split becomes a :class:`StreamedFeatures`, which reads rows from the open
file when asked. The trainer needs only two kinds of access:

* slices ``x[i:j]`` (evaluation, class statistics, prediction) — read on demand, never kept;
* training batches, from :meth:`StreamedFeatures.batches`: the training set is cut into *pieces* of
  ``piece_rows`` consecutive rows (a multiple of the batch size, about one HDF5 chunk); each epoch the pieces
  are shuffled and taken ``block_rows / piece_rows`` at a time as a *block*, which is read into memory
  (about half the cap), shuffled row by row and cut into batches. No batch crosses a block, every row is
  visited once per epoch, the order is fixed by the run's seed, and an epoch has ⌈N / batch⌉ batches, as in
  memory. Because a block gathers pieces from all over the file, a batch mixes classes even when the file is
  sorted by class (the more pieces per block — a larger cap — the better mixed).

The data order therefore differs from the in-memory one (a plain permutation): a streamed run is
deterministic, and its results match an in-memory run statistically, not bit for bit. The cap counts the
features kept in memory: one training block plus one evaluation chunk (≤ half the cap each); transient
reads and the logits are extra.
"""
from __future__ import annotations

import os
import re
from typing import Iterator

import h5py
import numpy as np
import torch

from .errors import UserError

DEFAULT_MAX_MEMORY = "8GiB"
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
          "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}
_GAP_ROWS = 256  # unwanted rows read through rather than starting a new read
_MIN_READ_ROWS = 4096


def parse_size(value: int | str, flag: str = "--max-memory") -> int | str:
    """Bytes from ``512MB``, ``8GB``, ``1.5GiB``, ``1000000`` (KB/MB/GB/TB: powers of 1000; KiB/MiB/GiB/TiB:
    of 1024), or the string ``auto``; ``UserError`` otherwise."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        size = int(value)
    else:
        text = str(value).strip().lower().replace(" ", "")
        if text == "auto":
            return "auto"
        m = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)([a-z]*)", text)
        if not m or m.group(2) not in _UNITS:
            raise UserError(f"{flag} takes a size such as 512MB, 8GB, 4GiB, a number of bytes, or 'auto'; "
                            f"got {value!r}")
        size = int(float(m.group(1)) * _UNITS[m.group(2)])
    if size <= 0:
        raise UserError(f"{flag} must be > 0 bytes, got {value!r}")
    return size


def available_memory(device: torch.device | str) -> int:
    """Free memory for features on ``device``: host MemAvailable; for CUDA also at most the free device memory
    (the loaded arrays pass through the host)."""
    device, host = torch.device(device), None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    host = int(line.split()[1]) * 1024
    except OSError:
        pass
    if host is None:
        try:
            host = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            host = 8 * 2**30
    if device.type == "cuda":
        return min(host, torch.cuda.mem_get_info(device)[0])
    return host


def resolve_max_memory(value: int | str, device: torch.device | str) -> int:
    """The cap in bytes; ``auto`` = half of :func:`available_memory` (then whether a file streams, and its
    block size, depend on the machine's free memory: pass a size for reproducible data order)."""
    size = parse_size(value)
    return available_memory(device) // 2 if size == "auto" else int(size)


def stream_layout(max_memory: int, dim: int, batch_size: int, chunk_rows: int | None) -> tuple[int, int]:
    """(block_rows, piece_rows) for a training set of width ``dim`` streamed under ``max_memory``: a block of
    float32 rows takes at most half the cap (at least one batch); a piece is the batch-size multiple nearest
    above the file's chunk rows (1024 if not chunked), smaller if a block cannot hold it; a block is a whole
    number of pieces."""
    budget = max(1, max_memory // 2 // (dim * 4))
    piece = batch_size * max(1, -(-(chunk_rows or 1024) // batch_size))
    if piece > budget:
        piece = batch_size * max(1, budget // batch_size)
    return piece * max(1, budget // piece), piece


class StreamedFeatures:
    """A [N, D] feature matrix left in an HDF5 dataset, with just enough of a tensor's interface for the trainer.

    ``rows``: the physical rows of ``ds`` that form this matrix (sorted; None = all), e.g. train minus a
    held-out val. ``len``, ``shape``, ``dtype`` (of the tensors returned; rows are converted from the file's
    float16/32) and ``device`` (where they are returned) behave as a tensor's; ``x[i:j]`` and ``x[index]``
    (1-D index tensor) read those rows; :meth:`batches` gives an epoch of training batches (module docstring).
    The dataset's file must stay open while this is used."""

    ndim = 2

    def __init__(self, ds: h5py.Dataset, rows: np.ndarray | None, device: torch.device | str, block_rows: int,
                 piece_rows: int | None = None, dtype: torch.dtype = torch.float32) -> None:
        self.ds = ds
        self.rows = None if rows is None else np.asarray(rows, dtype=np.int64)
        if self.rows is not None and len(self.rows) and (
                np.any(np.diff(self.rows) <= 0) or self.rows[0] < 0 or self.rows[-1] >= ds.shape[0]):
            raise ValueError("rows must be strictly increasing positions in the dataset")
        n = ds.shape[0] if self.rows is None else len(self.rows)
        self.shape = torch.Size((n, ds.shape[1]))
        self.dtype, self.device = dtype, torch.device(device)
        self.piece_rows = int(piece_rows or block_rows)
        self.block_rows = self.piece_rows * max(1, int(block_rows) // self.piece_rows)
        self._cached: tuple[tuple[int, ...], torch.Tensor, torch.Tensor] | None = None  # (pieces, positions, rows)

    def __len__(self) -> int:
        return self.shape[0]

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def __repr__(self) -> str:
        return (f"StreamedFeatures({self.ds.file.filename}:{self.ds.name}, shape={tuple(self.shape)}, "
                f"block_rows={self.block_rows}, piece_rows={self.piece_rows}, device={self.device})")

    def __getitem__(self, key) -> torch.Tensor:
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                raise IndexError("StreamedFeatures slices must have step 1")
            return self._read(self._physical(np.arange(start, max(start, stop), dtype=np.int64)))
        if isinstance(key, (torch.Tensor, np.ndarray, list)):
            pos = (key.detach().cpu().numpy() if isinstance(key, torch.Tensor) else np.asarray(key)).astype(np.int64)
            if pos.ndim != 1:
                raise IndexError("StreamedFeatures takes a 1-D index")
            if len(pos) and (pos.min() < -len(self) or pos.max() >= len(self)):
                raise IndexError(f"index out of range for {len(self)} rows")
            unique, inverse = np.unique(pos % max(len(self), 1), return_inverse=True)
            return self._read(self._physical(unique))[torch.from_numpy(inverse.reshape(-1)).to(self.device)]
        raise TypeError(f"StreamedFeatures supports x[i:j] and x[index tensor], not x[{type(key).__name__}]")

    def num_batches(self, batch_size: int) -> int:
        self._check_batch(batch_size)
        return -(-len(self) // batch_size)

    def batches(self, batch_size: int, gen: torch.Generator) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """One epoch: (positions [B] on the device, features [B, D]) per batch, in an order fixed by ``gen``."""
        self._check_batch(batch_size)
        n, per_block = len(self), self.block_rows // self.piece_rows
        pieces = torch.randperm(-(-n // self.piece_rows), generator=gen)
        for g in range(0, len(pieces), per_block):
            pos, block = self._block(tuple(sorted(pieces[g:g + per_block].tolist())))
            perm = torch.randperm(len(pos), generator=gen).to(self.device)
            for local in perm.split(batch_size):
                yield pos[local], block[local]
            del pos, block  # so that only one block is held while the next one is read

    def _check_batch(self, batch_size: int) -> None:
        if self.piece_rows % batch_size:
            raise ValueError(f"piece_rows {self.piece_rows} is not a multiple of the batch size {batch_size}")

    def _block(self, pieces: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows of ``pieces`` (positions, features), read or reused from the last block."""
        if self._cached is not None and self._cached[0] == pieces:
            return self._cached[1], self._cached[2]
        self._cached = None  # free the old block before reading the new one
        pr, n = self.piece_rows, len(self)
        pos = np.concatenate([np.arange(p * pr, min((p + 1) * pr, n), dtype=np.int64) for p in pieces])
        block = self._read(self._physical(pos))
        self._cached = (pieces, torch.from_numpy(pos).to(self.device), block)
        return self._cached[1], block

    def _physical(self, pos: np.ndarray) -> np.ndarray:
        return pos if self.rows is None else self.rows[pos]

    def _read(self, phys: np.ndarray) -> torch.Tensor:
        """Dataset rows ``phys`` (sorted) as [len, D] of ``dtype`` on ``device``: one read per run of nearby rows
        (gaps ≤ _GAP_ROWS read through), each at most max(4096, 2·len) rows long."""
        out = torch.empty((len(phys), self.shape[1]), dtype=self.dtype, device=self.device)
        limit = max(_MIN_READ_ROWS, 2 * len(phys))
        bounds = [0, *(np.flatnonzero(np.diff(phys) > _GAP_ROWS) + 1).tolist(), len(phys)]
        for a, b in zip(bounds[:-1], bounds[1:]):
            while a < b:
                c = a + int(np.searchsorted(phys[a:b], phys[a] + limit))
                lo, hi = int(phys[a]), int(phys[c - 1]) + 1
                arr = self._read_range(lo, hi)
                if hi - lo != c - a:
                    arr = arr[phys[a:c] - lo]
                out[a:c].copy_(torch.from_numpy(arr))
                a = c
        return out

    def _read_range(self, lo: int, hi: int) -> np.ndarray:
        try:
            return self.ds[lo:hi]
        except (OSError, RuntimeError, ValueError) as e:
            raise UserError(f"{self.ds.file.filename}: corrupt data in {self.ds.name} rows {lo}..{hi} "
                            f"({str(e).splitlines()[0][:120]}); the file is damaged: extract it again "
                            "with --overwrite") from None
