"""Uploads arrive in a directory of the receiving broker process's own
(broker/jobs/uploads.py `receiving_dir`): a broker killed mid-upload left
its part in /tmp for good; now the next broker to start there removes what
processes gone were receiving, and nothing of a live one's."""
from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

from spotbroker.agent.proctree import start_time
from spotbroker.broker.jobs.uploads import receiving_dir


def test_what_a_gone_broker_was_receiving_is_removed_and_a_live_ones_is_kept(tmp_path):
    settings = SimpleNamespace(data_dir=tmp_path / "data")
    root = settings.data_dir / "receiving"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for pid, started in ((gone.pid, "12345"), (live.pid, start_time(live.pid)), (live.pid, "1")):
            (root / f"{pid}-{started}").mkdir(parents=True, exist_ok=True)
            (root / f"{pid}-{started}" / "upload-x.tar.gz").write_bytes(b"part")
        mine = receiving_dir(settings)
        assert mine == root / f"{os.getpid()}-{start_time(os.getpid())}" and mine.is_dir()
        # a pid alive again with another start time is another process: its old part goes too
        assert sorted(p.name for p in root.iterdir()) == sorted([mine.name, f"{live.pid}-{start_time(live.pid)}"])
        assert oct(mine.stat().st_mode & 0o777) == oct(0o700)
    finally:
        live.kill()
        live.wait()
