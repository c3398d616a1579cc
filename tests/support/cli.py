"""The command line run as a user runs it (a real process), and its tables read back."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def spotbroker(*args: str, env: dict[str, str], cwd: Path | None = None, timeout: float = 60,
               stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spotbroker.broker.cli", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, input=stdin)


def cells(stdout: str, word: str) -> list[str]:
    """The cells of the one table row holding `word`."""
    rows = [line for line in stdout.splitlines() if f" {word} " in line and "│" in line]
    assert len(rows) == 1, stdout
    return [c.strip() for c in rows[0].split("│")[1:-1]]
