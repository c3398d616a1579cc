"""Where a command's CPU goes, by kind of process: every process on the
machine is sampled from /proc every 0.2 s while COMMAND runs, each keeps
the CPU it had at its last sample, and they are summed by what they run
(the first words of their command line). A process already running when
COMMAND starts counts only what it spends after (PostgreSQL, say).
Processes shorter than a sample are undercounted. docs/benchmarks.md ("eleventh round") was measured so:

    python bench/suite_processes.py -- make test
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections import defaultdict

TICK = os.sysconf("SC_CLK_TCK")


def sample(seen: dict[tuple[int, str], list], stop: threading.Event) -> None:
    me = os.getpid()
    while True:
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == me:
                continue
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                key = (int(name), fields[19])  # a pid and its start time: one process
                ticks = int(fields[11]) + int(fields[12])
                with open(f"/proc/{name}/cmdline", "rb") as f:  # read again: a child first seen before its exec
                    cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
                seen[key] = [max(ticks, seen.get(key, [0])[0]), cmdline or seen.get(key, [0, ""])[1]]
            except (OSError, IndexError, ValueError):  # gone meanwhile
                continue
        if stop.wait(0.2):
            return


def _set(event: threading.Event) -> threading.Event:
    event.set()
    return event


def kind(cmdline: str) -> str:
    words = cmdline.split()
    if not words:
        return "(kernel or unnamed)"
    exe = os.path.basename(words[0])
    if exe.startswith("python") and len(words) > 1:
        if words[1] in ("-m", "-c") and len(words) > 2:
            return f"python {words[1]} {words[2][:40]}"
        flags = [w for w in words[1:] if w.startswith("-")]
        script = next((w for w in words[1:] if not w.startswith("-")), "")
        return f"python {' '.join(flags[:1])} {os.path.basename(script)}".replace("  ", " ")
    return f"{exe} {os.path.basename(words[1])[:30] if len(words) > 1 else ''}".strip()


def main(argv: list[str]) -> int:
    command = argv[argv.index("--") + 1:] if "--" in argv else argv
    if not command:
        print(__doc__)
        return 2
    seen: dict[tuple[int, str], list] = {}
    sample(seen, _set(threading.Event()))  # what runs already: its CPU so far is not the command's
    before = {key: ticks for key, (ticks, _) in seen.items()}
    stop = threading.Event()
    sampler = threading.Thread(target=sample, args=(seen, stop), daemon=True)
    sampler.start()
    try:
        code = subprocess.call(command)
    finally:
        stop.set()
        sampler.join()
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for key, (ticks, cmdline) in seen.items():
        spent = ticks - before.get(key, 0)
        if spent or key not in before:
            by_kind[kind(cmdline)][0] += spent / TICK
            by_kind[kind(cmdline)][1] += 1
    total = sum(cpu for cpu, _ in by_kind.values())
    counted = sum(n for _, n in by_kind.values())
    print(f"\n{total:.0f} CPU-seconds in {counted} processes (command exited {code})")
    print(f"{'CPU s':>8} {'procs':>6}  kind")
    for name, (cpu, n) in sorted(by_kind.items(), key=lambda kv: -kv[1][0])[:30]:
        print(f"{cpu:8.1f} {n:6d}  {name}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
