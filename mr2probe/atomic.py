"""Atomic file writes: write ``<path>.<pid>.tmp``, then rename, so a reader never sees a half-written file."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from .errors import UserError


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` and rename tmp → ``path``; on failure remove tmp and raise a one-line UserError."""
    path = Path(path)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        tmp.unlink(missing_ok=True)  # gone after the rename; left by any failure (a bad input, Ctrl-C) otherwise


def atomic_text(path: Path, text: str) -> None:
    atomic_write(path, lambda p: p.write_text(text))
