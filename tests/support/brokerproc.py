"""`spotbroker serve` as a process of its own, for the tests that kill it,
restart it, or run several on one database."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from support.ports import free_port

# What the suite's brokers run with unless a test says otherwise: the price
# snapshot only (no test reaches the network), and no SkyPilot import in the
# background (seconds of CPU per start, for brokers that read no task file).
TEST_DEFAULTS = {"SPOTBROKER_PRICES_SOURCES": "catalog", "SPOTBROKER_PRELOAD_SKYPILOT": "false"}


def broker_env(**settings: str) -> dict[str, str]:
    """This process's environment less its SPOTBROKER_ settings, with the
    suite's defaults and `settings`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}
    return {**env, **TEST_DEFAULTS, **settings}


class BrokerProcess:
    """One broker on a port of its own, kept across restarts; its output appended to `log`."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log, self.port, self.proc = env, log, free_port(), None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "spotbroker.broker.cli", "serve", "--port",
                                          str(self.port), "--log-level", "warning"], env=self.env, stdout=out,
                                         stderr=subprocess.STDOUT)

    def ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self) -> None:
        """Down at once, as a crash or a lost host would be."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
