"""Who starts a local node: a claim per node in the run's directory, so that
a node is started once however many launchers (brokers on this host,
restarted ones) launch its attempt (broker/launch/local.py).

    {run_dir}/node-{rank}.claim   "PID START": the launcher process that claimed it

A launcher that finds the claim taken waits for the node the claimer may
have started: its own record (`node-{rank}.self`), or a process whose
command line names its spec file (its interpreter can take a while to write
the record on a loaded host). If the claimer has exited, whatever it started
is running by now, so a second's look is enough before starting the node
itself: brokers killed every few seconds once each waited the full 5 s for a
node that no one had started, and none lived long enough to start it.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from spotbroker.agent import proctree
from spotbroker.agent.proctree import start_time

GONE_CLAIMER_WAIT_S = 1.0  # a node forked just before its launcher died: time for its exec


def claim_node(run_dir: Path, rank: int, wait_s: float = 5.0) -> dict | None:
    """Claim the right to start node `rank` (atomically, O_EXCL): None means
    "start it now"; else the record of the node an earlier claimer started."""
    claim = run_dir / f"node-{rank}.claim"
    try:
        fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as f:
            f.write(_this_process())
        return None
    gone = claimer_gone(claim)
    if gone:
        wait_s = min(wait_s, GONE_CLAIMER_WAIT_S)
    own, spec = run_dir / f"node-{rank}.self", str(run_dir / f"node-{rank}.spec.json")
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if own.exists():
            pid, start = own.read_text().split()
            return {"rank": rank, "pid": int(pid), "start": start, "marks_start": True}
        for pid in proctree.with_argument(spec):
            if start := start_time(pid):
                return {"rank": rank, "pid": pid, "start": start, "marks_start": True}
        time.sleep(0.1)
    if gone:  # the claim is ours now: a launcher after us waits for our node
        # (Two launchers at one dead claim at once would both get here; the
        # job's row lease lets one broker at a time launch its attempt.)
        taken = claim.with_suffix(f".claim.{os.getpid()}")
        taken.write_text(_this_process())
        taken.replace(claim)
    return None  # nothing was started under the earlier claim


def _this_process() -> str:
    """What a claim names: this process, by pid and start time (a pid is reused)."""
    return f"{os.getpid()} {start_time(os.getpid())}"


def claimer_gone(claim: Path) -> bool:
    """Has the process that wrote `claim` exited? An empty claim (its
    launcher died between creating and naming it) names no one: gone too."""
    try:
        fields = claim.read_text().split()
    except OSError:
        return False  # (unreadable: wait, as for a live claimer)
    if not fields:
        return True
    if len(fields) != 2 or not fields[0].isdigit():
        return False
    return start_time(int(fields[0])) != fields[1]
