"""Where the nodes of a local attempt meet: one free port, the same for all.

Every node of a local attempt is this host, so a rendezvous port fixed in
the job's command, or made from the attempt's id (which another broker's
database repeats), may be taken when the attempt starts: by another
attempt, a server, anything. A trainer that cannot bind it exits at once.
The launcher picks a free port once per attempt, keeps it in the run's
directory (a launcher started after a crash gives the nodes it starts the
same one), and gives it to each node as torch's own MASTER_ADDR and
MASTER_PORT (`torchrun --master_addr=$MASTER_ADDR --master_port=$MASTER_PORT`).
"""
from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

PORT_FILE = "master.port"
ADDR = "127.0.0.1"


def master_port(run_dir: Path) -> int:
    """The attempt's port: the one kept in `run_dir`, else a free one, kept there."""
    kept = run_dir / PORT_FILE
    if kept.exists():
        return int(kept.read_text())
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))  # the kernel's pick: free on every address now
        port = s.getsockname()[1]
    mine = run_dir / f"{PORT_FILE}.{os.getpid()}.{threading.get_ident()}"
    mine.write_text(str(port))
    try:
        os.link(mine, kept)  # whole or not at all; the first launcher's pick stands
    except FileExistsError:
        pass
    finally:
        mine.unlink()
    return int(kept.read_text())


def rendezvous_env(run_dir: Path, num_nodes: int) -> dict[str, str]:
    """MASTER_ADDR and MASTER_PORT for an attempt of several nodes (one node meets no other)."""
    if num_nodes < 2:
        return {}
    return {"MASTER_ADDR": ADDR, "MASTER_PORT": str(master_port(run_dir))}
