"""Long steps show their progress (issue #25): on a terminal, `spotbroker
submit` draws a bar with bytes and rate while it packs and uploads a
workdir; piped, or with --json, it prints its plain summary line and nothing
that rewrites a line. A real process, its stderr on a pseudo-terminal."""
from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys

from conftest import ADMIN_TOKEN
from support.helpers import team_token

CLI = [sys.executable, "-m", "spotbroker.broker.cli"]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def on_a_terminal(args: list[str], env: dict[str, str], cwd) -> tuple[int, str, str]:
    """(exit status, stdout, what stderr drew on the terminal, one line per redraw)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(CLI + args, env={**env, "TERM": "xterm", "COLUMNS": "120"}, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    drawn = b""
    while True:
        if select.select([master], [], [], 0.1)[0]:
            try:
                data = os.read(master, 1 << 16)
            except OSError:  # the other end closed
                break
            if not data:
                break
            drawn += data
        elif proc.poll() is not None:
            break
    os.close(master)
    out = proc.stdout.read().decode()
    proc.wait(30)
    return proc.returncode, out, ANSI.sub("", drawn.decode(errors="replace")).replace("\r", "\n")


def test_submit_draws_packing_and_upload_bars_on_a_terminal_only(api, env, tmp_path):
    env = {**env, "SPOTBROKER_TOKEN": team_token(api, "ml", ADMIN_TOKEN)}
    (tmp_path / "wd").mkdir()
    (tmp_path / "wd" / "data.bin").write_bytes(os.urandom(6_000_000))  # incompressible: 6.0 MB packed too
    (tmp_path / "task.yaml").write_text("name: big\nworkdir: wd\nrun: ls\n")
    status, out, drawn = on_a_terminal(["submit", "task.yaml"], env, tmp_path)
    assert status == 0 and out.startswith("submitted job "), drawn
    packing = [line for line in drawn.splitlines() if line.startswith("packing workdir")]
    uploading = [line for line in drawn.splitlines() if line.startswith("uploading workdir ━")]
    assert packing and uploading, drawn
    assert re.search(r" 6\.0/6\.0 MB [0-9.]+ [kMG]?B/s ", packing[-1]), packing[-1]  # bytes, and the rate
    assert any(re.search(r" 6\.0/6\.0 MB [0-9.]+ [kMG]?B/s ", line) for line in uploading), uploading
    (tmp_path / "wd" / "data.bin").write_bytes(os.urandom(6_000_000))  # new bytes: uploaded again

    piped = subprocess.run(CLI + ["submit", "task.yaml"], env=env, cwd=tmp_path, capture_output=True, text=True,
                           timeout=120)
    assert piped.returncode == 0, piped.stderr
    assert "uploading workdir" in piped.stderr and "1 files, 6.0 MB" in piped.stderr
    assert "\r" not in piped.stderr and "\x1b" not in piped.stderr and "━" not in piped.stderr

    (tmp_path / "wd" / "data.bin").write_bytes(os.urandom(6_000_000))
    status, out, drawn = on_a_terminal(["submit", "task.yaml", "--json"], env, tmp_path)
    assert status == 0 and '"state"' in out
    assert "━" not in drawn and "B/s" not in drawn and "uploading workdir" in drawn
