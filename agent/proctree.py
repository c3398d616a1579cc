"""A process and everything it started, read from /proc (Linux).

Trainers leave their process group and session freely (`torchrun` starts
each worker in a session of its own, daemons double-fork), so neither a
group nor a session says which processes belong to a run. Parentage does,
as long as whoever started the run is a child subreaper: orphans below it
are re-parented to it instead of to init, and stay in its tree.
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
PR_SET_DUMPABLE = 4


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name (which may hold spaces and parentheses)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()


def parent_of(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def start_time(pid: int) -> str | None:
    """The kernel's start time of a live process (None if gone or a zombie):
    tells a live pid from a reused one."""
    fields = _stat_fields(pid)
    if not fields or fields[0] == "Z":
        return None
    return fields[19]


def with_argument(arg: str) -> list[int]:
    """Live processes (this user can read) that have `arg` as one word of
    their command line."""
    word, found = os.fsencode(arg), []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if word in argv and start_time(int(entry.name)) is not None:
                found.append(int(entry.name))
    return found


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            ppid = parent_of(int(entry.name))
            if ppid is not None:
                children.setdefault(ppid, []).append(int(entry.name))
    return children


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, parents before their children."""
    children, found, queue = _children(), [], [pid]
    while queue:
        for child in children.get(queue.pop(0), ()):
            found.append(child)
            queue.append(child)
    return found


def is_descendant(pid: int, ancestor: int) -> bool:
    """Is `pid` below `ancestor` (walking up the parent links)?"""
    seen = 0
    while pid > 1 and seen < 4096:  # a bound, not a depth anyone reaches
        pid = parent_of(pid) or 0
        if pid == ancestor:
            return True
        seen += 1
    return False


def signal_tree(pid: int, sig: int, include_root: bool = True, spare: tuple[int, ...] = ()) -> int:
    """Send `sig` to `pid` (unless told not to) and every process below it,
    except those in `spare` and the caller; returns how many were signalled."""
    targets = ([pid] if include_root else []) + descendants(pid)
    return sum(_send(p, sig) for p in targets if p not in spare and p != os.getpid())


def signal_group_and_tree(pid: int, sig: int) -> int:
    """Send `sig` once to every process of `pid`'s group and of its tree (a
    process in both is signalled once); how many besides the group's."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    outside = []
    for p in descendants(pid):
        try:
            if os.getpgid(p) != pid:
                outside.append(p)
        except ProcessLookupError:
            continue
    return sum(_send(p, sig) for p in outside if p != os.getpid())


def kill_tree(pid: int, spare: tuple[int, ...] = ()) -> int:
    """SIGKILL `pid` and every process below it, none escaping: the tree is
    frozen first (SIGSTOP, round after round until no new process appears, as
    a stopped process cannot fork), then killed at once. Killing the root
    first would hand its children to init, out of reach of this walk."""
    frozen: list[int] = []
    for _ in range(100):
        new = [p for p in [pid, *descendants(pid)] if p not in frozen and p not in spare and p != os.getpid()]
        if not new:
            break
        for target in new:
            _send(target, signal.SIGSTOP)
        frozen.extend(new)
    return sum(_send(p, signal.SIGKILL) for p in frozen)


def _send(pid: int, sig: int) -> int:
    try:
        os.kill(pid, sig)
        return 1
    except (ProcessLookupError, PermissionError):
        return 0


def become_subreaper() -> bool:
    """Make orphans below this process its children (Linux; False elsewhere)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def become_private() -> bool:
    """Keep this process's memory from the other processes of its user: its
    /proc files (environ, mem, maps) become root's and ptrace cannot attach
    (Linux; False elsewhere). The node agent holds the attempt's token and
    shares its uid with the trainer; the trainer it starts is dumpable again
    from its exec, so debugging it is unchanged."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
