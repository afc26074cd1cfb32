"""Rich progress bars for long work (extraction, training), silent when disabled or not on a terminal."""
from __future__ import annotations

import contextlib
import sys
from typing import Iterator

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)

console = Console(stderr=True)


class _Bar:
    def __init__(self, progress: Progress | None, task: int | None) -> None:
        self.progress, self.task = progress, task

    def advance(self, n: float = 1) -> None:
        if self.progress is not None:
            self.progress.advance(self.task, n)

    def update(self, **kw) -> None:
        if self.progress is not None:
            self.progress.update(self.task, **kw)


@contextlib.contextmanager
def progress_bar(description: str, total: float, completed: float = 0, enabled: bool = True) -> Iterator[_Bar]:
    """``with progress_bar("extract train", total=n) as bar: bar.advance(k)``; shows rate and ETA."""
    if not enabled:
        yield _Bar(None, None)
        return
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TaskProgressColumn(), TimeElapsedColumn(), TimeRemainingColumn(), console=console,
                        transient=not sys.stderr.isatty(), disable=not sys.stderr.isatty())
    with progress:
        task = progress.add_task(description, total=total, completed=completed)
        yield _Bar(progress, task)
