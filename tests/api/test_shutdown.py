"""SIGTERM stops a server within SPOTBROKER_SHUTDOWN_GRACE_SECONDS however
long a request still in flight would take: a client trickling an upload
held a stopping server until a second signal (an orchestrator's SIGKILL)."""
from __future__ import annotations

import signal
import threading
import time

import httpx
from conftest import ADMIN_TOKEN
from support.helpers import wait_for


def test_a_request_still_in_flight_is_cut_off_after_the_grace(serve_process):
    with serve_process(SPOTBROKER_SHUTDOWN_GRACE_SECONDS="2") as server:
        made = httpx.post(f"{server.url}/v1/teams", json={"name": "a"},
                          headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()
        stop = threading.Event()
        sent = threading.Event()

        def trickle():  # a byte every 0.2 s: never idle long enough to be given up as stalled
            while not stop.is_set():
                sent.set()
                yield b"\0"
                time.sleep(0.2)

        def upload():
            try:
                httpx.put(f"{server.url}/v1/uploads/{'e' * 64}", content=trickle(), timeout=60,
                          headers={"Authorization": f"Bearer {made['token']}", "Content-Type": "application/gzip"})
            except httpx.HTTPError:
                pass  # cut off: what the test is about

        client = threading.Thread(target=upload, daemon=True)
        client.start()
        try:
            assert sent.wait(10)
            time.sleep(1)  # the request is in the server's hands
            server.proc.send_signal(signal.SIGTERM)
            wait_for(lambda: server.proc.poll() is not None, timeout=30, what="the server to exit after SIGTERM")
        finally:
            stop.set()
            client.join(10)
        out = server.output()
        assert "timeout graceful shutdown exceeded" in out and "Application shutdown complete" in out, out[-2000:]
