"""Where the commands print their tables.

In a terminal, rich fits a table to its width. Piped or redirected (a file,
`grep`, cron) there is no width to fit, and rich's default of 80 columns
folded every value of a wide table into unreadable slivers: there, tables
keep their natural width, one row per line.
"""
from __future__ import annotations

import math
import os
import re
import sys

import click

# C0 (but newline and tab), DEL and C1: in a terminal each may start a
# sequence that moves the cursor, rewrites lines or sets the window title.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


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


def printable(text: str) -> str:
    """A job's text (a trainer's output tail, a reason quoting it) as a
    terminal may show it: control characters written as `\\xNN`, so that
    a tenant's output cannot drive the operator's terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", text)


def safe_markup(text: str) -> str:
    """`printable`, and its brackets taken as text by rich (no markup of a tenant's)."""
    from rich.markup import escape

    return escape(printable(text))


class FiniteFloat(click.FloatRange):
    """A float range that refuses nan and inf: every comparison with nan is
    false, so a range let it through, and the JSON it went into could not be
    written (a traceback)."""

    name = "finite float"

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value} is not a finite number", param, ctx)
        return number
