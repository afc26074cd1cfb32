"""Shared helpers for entries whose files follow a torchvision dataset layout under ``--root``.

Missing data becomes one :class:`UserError` line that names the folder and the fix (``--download`` or the layout);
torchvision's own "Dataset not found" RuntimeErrors and download failures never reach the user as tracebacks.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import UserError


def one_line(err: BaseException) -> str:
    """The first line of an exception's message (or its type name when the message is empty)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def fix_hint(downloadable: bool) -> str:
    """What to tell the user when the files are not there."""
    if downloadable:
        return "pass --download to fetch it into --root, or point --root at the folder that holds it"
    return "it cannot be downloaded automatically; put the files there by hand"


def dataset_root(root: Path | None, download: bool, what: str, layout: str, downloadable: bool = True) -> Path:
    """``--root`` as a Path: required; created when downloading, else it must already exist."""
    if root is None:
        where = " (or where --download should put it)" if downloadable else ""
        raise UserError(f"{what} needs --root DIR: the folder that holds {layout}{where}")
    root = Path(root).expanduser()
    if download and downloadable:
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"{what}: cannot create --root {root}: {one_line(e)}") from None
    elif not root.is_dir():
        raise UserError(f"{what}: data folder {root} does not exist (expected {root / layout}); "
                        f"{fix_hint(downloadable)}")
    return root


@contextmanager
def user_errors(what: str, root: Path, layout: str, download: bool, downloadable: bool = True) -> Iterator[None]:
    """Turn torchvision's not-found/corrupt RuntimeErrors and I/O or download errors into one-line UserErrors."""
    try:
        yield
    except (RuntimeError, OSError) as e:
        if download and downloadable:
            raise UserError(f"{what}: could not download or read it into {root}: {one_line(e)}") from None
        reason = one_line(e)
        detail = "" if reason.startswith("Dataset not found") else f" ({reason})"
        raise UserError(f"{what}: not found or incomplete under {root}{detail}; expected {root / layout}; "
                        f"{fix_hint(downloadable)}") from None
