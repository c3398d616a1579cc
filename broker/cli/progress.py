"""Progress of the steps a user waits on: packing and uploading a workdir (a
bar with bytes and rate), the broker's answer to a submission (a spinner).

Only on a terminal (stderr, where they are drawn): piped, redirected, in
CI or with --json, a command prints its plain one-line summaries and
nothing that moves or rewrites a line.
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def on_terminal(as_json: bool = False) -> bool:
    return not as_json and sys.stderr.isatty()


@contextmanager
def bar(description: str, total: int | None, shown: bool) -> Iterator[Callable[..., None]]:
    """A bar of `total` bytes, drawn from the first bytes done (a step that
    turns out to have nothing to do draws nothing) and left on screen when
    done, its size, rate and time readable. Yields what to call with the
    bytes done so far (and the total, once known)."""
    if not shown:
        yield lambda done, total=None: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn, TransferSpeedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeElapsedColumn())
    progress = Progress(*columns, console=Console(stderr=True))
    task = progress.add_task(description, total=total)

    def update(done: int, total: int | None = None) -> None:
        if not progress.live.is_started:
            progress.start()
        progress.update(task, completed=done, total=total)

    try:
        yield update
    finally:
        if progress.live.is_started:
            progress.stop()


@contextmanager
def waiting(text: str, shown: bool) -> Iterator[None]:
    """A spinner with `text` while the broker works; nothing otherwise."""
    if not shown:
        yield
        return
    from rich.console import Console

    with Console(stderr=True).status(text):
        yield
