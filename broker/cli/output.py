"""Where the commands print their tables.

In a terminal, rich fits a table to its width. Piped or redirected (a file,
`grep`, cron) there is no width to fit, and rich's default of 80 columns
folded every value of a wide table into unreadable slivers: there, tables
keep their natural width, one row per line.
"""
from __future__ import annotations

import os
import sys


def console():
    from rich.console import Console

    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console()
    return Console(width=10_000)


def table(*columns: str, title: str | None = None):
    from rich.table import Table

    return Table(*columns, title=title)


def show(table_) -> None:
    console().print(table_)


def when(iso: str | None) -> str:
    """An API time as a table shows it: to the minute, UTC."""
    return "-" if not iso else iso[:16].replace("T", " ")
