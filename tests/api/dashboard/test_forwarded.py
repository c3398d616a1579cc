"""Behind a TLS-terminating ingress: `spotbroker serve` believes X-Forwarded-Proto
from the proxies SPOTBROKER_FORWARDED_ALLOW_IPS names, and the dashboard's cookie
is Secure exactly when the client's scheme is https. Through a real server
process, as an ingress would reach it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from support.ports import free_port

ADMIN = "admin-token-forwarded"


@pytest.fixture
def serve(tmp_path):
    started: list[subprocess.Popen] = []

    def start(forwarded_allow_ips: str | None, **more: str) -> str:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}
        env.update(SPOTBROKER_DATA_DIR=str(tmp_path / f"data-{port}"), SPOTBROKER_ADMIN_TOKEN=ADMIN,
                   SPOTBROKER_PRICES_SOURCES="catalog", **more)
        if forwarded_allow_ips is not None:
            env["SPOTBROKER_FORWARDED_ALLOW_IPS"] = forwarded_allow_ips
        proc = subprocess.Popen([str(Path(sys.executable).parent / "spotbroker"), "serve", "--host", "127.0.0.1",
                                 "--port", str(port), "--log-level", "warning"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        started.append(proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    return url
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)

    yield start
    for proc in started:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def login_cookie(url: str, **headers: str) -> str:
    host = url.removeprefix("http://")
    scheme = "https" if headers.get("X-Forwarded-Proto") == "https" else "http"
    answer = httpx.post(f"{url}/dashboard/login", content=f"token={ADMIN}", timeout=10,
                        headers={"Content-Type": "application/x-www-form-urlencoded",
                                 "Origin": f"{scheme}://{host}", **headers})
    assert answer.status_code == 303, answer.text
    return answer.headers["set-cookie"]


def flags(cookie: str) -> set[str]:
    return {part.strip().split("=")[0].lower() for part in cookie.split(";")[1:]}


def test_the_cookie_is_secure_exactly_when_a_trusted_proxy_says_https(serve):
    url = serve("127.0.0.1")
    assert "secure" in flags(login_cookie(url, **{"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.7"}))
    assert "secure" not in flags(login_cookie(url, **{"X-Forwarded-Proto": "http"}))
    assert "secure" not in flags(login_cookie(url))


def test_an_untrusted_peer_cannot_claim_https(serve):
    url = serve("192.0.2.10")  # the ingress's address: this client (127.0.0.1) is not it
    assert "secure" not in flags(login_cookie(url, **{"X-Forwarded-Proto": "https"}))


def test_unset_a_proxy_on_this_host_is_believed_unless_local_jobs_run_here(serve):
    """Every team's local job connects from 127.0.0.1: with the local launcher
    on, its X-Forwarded-For named any client address in the broker's log, and
    its X-Forwarded-Proto the cookie's scheme."""
    local = serve(None)  # on loopback the local launcher is on by default
    assert "secure" not in flags(login_cookie(local, **{"X-Forwarded-Proto": "https"}))
    cloud_only = serve(None, SPOTBROKER_LOCAL_LAUNCHER="false")
    assert "secure" in flags(login_cookie(cloud_only, **{"X-Forwarded-Proto": "https"}))
