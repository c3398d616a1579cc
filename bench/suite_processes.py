"""Where a command's CPU goes, process by process, through the kernel's
process accounting (as root): what `time` misses (servers that daemonise,
PostgreSQL's backends) is counted too.

    sudo python bench/suite_processes.py -- bash .ci/run

Prints the CPU seconds of every process that ended while the command ran,
by name (jobs' processes, run as the local launcher's uids, apart): the
command's own process tree, the processes that outlived their parents
(SkyPilot's API server, Chromium's helpers), and the rest of the machine
(PostgreSQL; anything else running meanwhile, so run it on a quiet machine).
A Python process is named "python" whatever it runs.
"""
from __future__ import annotations

import collections
import ctypes
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

RECORD = 64            # struct acct_v3 (linux/acct.h)
JOB_UIDS = range(1_900_000_000, 1_901_000_000)   # SPOTBROKER_LOCAL_UID_RANGE's default


def _comp(value: int) -> int:
    """comp_t: a 13-bit mantissa and a 3-bit base-8 exponent, in clock ticks."""
    return (value & 0x1FFF) << (3 * (value >> 13))


def records(path: str) -> list[dict]:
    data, ticks = Path(path).read_bytes(), os.sysconf("SC_CLK_TCK")
    out = []
    for i in range(0, len(data) - RECORD + 1, RECORD):
        rec = data[i:i + RECORD]
        if rec[1] & 0x0F != 3:
            raise SystemExit(f"{path}: not version-3 accounting records")
        _, _, _, _, uid, _, pid, ppid, _, _ = struct.unpack("<BBHIIIIIIf", rec[:32])
        utime, stime = struct.unpack("<HH", rec[32:36])
        name = rec[48:64].split(b"\0")[0].decode(errors="replace")
        out.append({"pid": pid, "ppid": ppid, "cpu": (_comp(utime) + _comp(stime)) / ticks,
                    "name": ("[job] " if uid in JOB_UIDS else "") + name})
    return out


def main() -> int:
    if "--" not in sys.argv:
        raise SystemExit(__doc__)
    command = sys.argv[sys.argv.index("--") + 1:]
    libc = ctypes.CDLL(None, use_errno=True)
    fd, path = tempfile.mkstemp(prefix="spotbroker-acct-")
    os.close(fd)
    if libc.acct(path.encode()) != 0:
        raise SystemExit(f"process accounting could not start: {os.strerror(ctypes.get_errno())} (run as root)")
    try:
        rc = subprocess.call(command)
    finally:
        libc.acct(None)
    recs = records(path)
    os.unlink(path)
    parent = {r["pid"]: r["ppid"] for r in recs}
    me = os.getpid()

    def of_command(pid: int) -> bool:
        for _ in range(64):
            if pid == me:
                return True
            if pid not in parent:
                return False
            pid = parent[pid]
        return False

    groups = {"the command's tree": collections.Counter(), "outlived their parent": collections.Counter(),
              "the rest of the machine": collections.Counter()}
    for r in recs:
        group = ("the command's tree" if of_command(r["ppid"]) else
                 "outlived their parent" if r["ppid"] == 1 else "the rest of the machine")
        groups[group][r["name"]] += r["cpu"]
    for group, cpu in groups.items():
        print(f"{group}: {sum(cpu.values()):.1f} s of CPU")
        for name, seconds in cpu.most_common(12):
            print(f"  {seconds:8.1f}  {name}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
