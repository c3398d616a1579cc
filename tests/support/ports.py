"""Ports for the suite's servers.

The port the kernel hands out for `bind(0)` comes from its ephemeral range,
the range every outgoing connection takes its own port from too: on a busy
machine a client's connection took such a port between a test's pick and
its server's bind ("address already in use"). The suite's ports come from
just below that range, where no connection takes one, at random, and free
when picked.
"""
from __future__ import annotations

import random
import socket
from pathlib import Path

_SPAN = 12_000  # ports below the ephemeral range to pick from
_random = random.SystemRandom()  # not the tests' seeded generator: two workers must not pick alike


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on, for a server to bind next."""
    start = _ephemeral_start()
    if start - _SPAN < 1024:  # a host that lent (nearly) every port to connections: the kernel's pick
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    for _ in range(200):
        port = _random.randrange(start - _SPAN, start)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {start - _SPAN}-{start - 1}")
