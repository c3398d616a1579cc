"""SkyPilot's API server gone or answering 5xx never fails an attempt: the
real SkyPilot SDK sends to a port where nothing listens, or to an HTTP
server that answers 503 to everything; the reconciler keeps the attempt
LAUNCHING, says why, tries again with back-off, and the launch timeout
still bounds it. (The server coming back is test_launch_moto.py's.)"""
from __future__ import annotations

import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sqlalchemy import select
from support.ports import free_port

from spotbroker.broker import auth
from spotbroker.broker.clock import Clock
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.launch.base import LauncherUnavailable, LaunchRequest
from spotbroker.broker.launch.launching import RETRYING
from spotbroker.broker.pricing.offers import Placement, seed_from_catalog
from spotbroker.broker.reconciler import Reconciler
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Attempt, Event, Job
from spotbroker.broker.usecases import jobs


class ShiftedClock(Clock):
    def __init__(self) -> None:
        self.shift = timedelta()

    def now(self):
        return super().now() + self.shift


class Answers503(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


def _closed_port() -> int:
    return free_port()


def _clear_sky_caches() -> None:
    from sky.server import common

    common.get_server_url.cache_clear()
    common.is_api_server_local.cache_clear()
    common.get_api_server_status_response.cache_clear()


@pytest.fixture(params=["refused", "503"])
def gone_server(request, monkeypatch):
    """SKYPILOT_API_SERVER_ENDPOINT at a server that is not there, or answers 503."""
    server = None
    if request.param == "503":
        server = ThreadingHTTPServer(("127.0.0.1", 0), Answers503)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        port = server.server_address[1]
    else:
        port = _closed_port()
    monkeypatch.setenv("SKYPILOT_API_SERVER_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("SKYPILOT_DISABLE_USAGE_COLLECTION", "1")
    _clear_sky_caches()
    try:
        yield request.param
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        monkeypatch.delenv("SKYPILOT_API_SERVER_ENDPOINT")
        _clear_sky_caches()


def test_a_launch_the_server_cannot_take_stays_launching_and_is_retried_until_the_timeout(
        factory, settings, tmp_path, gone_server) -> None:
    from spotbroker.broker.launch.skypilot.launcher import SkyPilotLauncher

    settings.skypilot_launch_timeout = 600.0
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    with transaction(factory) as s:
        seed_from_catalog(s)
        team, _ = auth.create_team(s, "ml")
        job_id = jobs.submit(s, team.id, JobSpec.model_validate(
            {"run": "python train.py", "resources": {"accelerators": "T4:1", "infra": "aws"}})).id
    launcher = SkyPilotLauncher(tmp_path, prefix="sbgone", launch_timeout_s=settings.skypilot_launch_timeout)
    # `sky check` answered before the server went away (until its first answer, jobs are held:
    # test_launch_clouds.py); the outage under test is one after start-up
    launcher._clouds = frozenset({"aws"})
    clock = ShiftedClock()
    rec = Reconciler(factory, {"skypilot": launcher}, settings, clock=clock)
    try:
        with pytest.raises(LauncherUnavailable, match="SkyPilot's API server does not answer"):
            launcher.launch(_request())  # what the reconciler meets
        for _ in range(3):  # three passes, each one try a back-off apart
            rec.pass_once()
            clock.shift += timedelta(seconds=settings.launch_retry_max)
        with factory() as s:
            job = s.get(Job, job_id)
            (attempt,) = s.scalars(select(Attempt).where(Attempt.job_id == job_id)).all()
            retries = s.scalars(select(Event).where(Event.job_id == job_id, Event.type == "launch_retry")).all()
            assert (job.state, attempt.state, attempt.handle) == ("LAUNCHING", "LAUNCHING", None)
            assert job.reason.startswith(RETRYING + "SkyPilot's API server does not answer"), job.reason
            assert len(retries) == 1, "said once per outage, not at every try"
            assert job.next_check_at is not None

        # Past the launch timeout: that place gave no node in time, as a launch still waiting then
        # (a capacity refusal: the job is placed again), never a failed job.
        clock.shift += timedelta(seconds=settings.skypilot_launch_timeout)
        rec.pass_once()
        with factory() as s:
            job = s.get(Job, job_id)
            (attempt,) = s.scalars(select(Attempt).where(Attempt.job_id == job_id)).all()
            assert (job.state, attempt.state, attempt.end_reason) == ("RECOVERING", "FAILED", "no_capacity")
    finally:
        launcher.close()


def _request() -> LaunchRequest:
    where = Placement(cloud="aws", region="us-east-1", zone="us-east-1a", zone_id=None, instance_type="g4dn.xlarge",
                      accelerator="T4", accelerator_count=1, use_spot=True, price_per_hour=0.2)
    return LaunchRequest(attempt_id=999, job_id=1, team="t", run="python train.py", setup=None, envs={},
                         num_nodes=1, placement=where)


def test_a_local_server_the_broker_started_is_collected_once_it_ends():
    """SkyPilot's start leaves its server a child of the broker that nothing
    waits for: after `sky api stop` it stayed a zombie of the broker. The
    janitor's next probe collects it; another thread's child is left alone."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    from spotbroker.broker.launch.skypilot.server import ServerWatch

    def state(pid: int) -> str | None:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return None

    class Sky:  # SkyPilot's start as it is: a Popen it does not keep, returned once the server is up
        def api_start(self):
            server = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(1)",
                                       "sky.server.server"], stdout=subprocess.PIPE)
            assert server.stdout.readline() == b"up\n"

    watch = ServerWatch(Sky())
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"])  # not the server
    watch.start_local()
    [server] = watch.started
    deadline = time.monotonic() + 20
    while state(server) not in ("Z", None) and time.monotonic() < deadline:  # the stop: it ends
        time.sleep(0.05)
    # a zombie until collected (Python's own subprocess may collect a dropped Popen's child at
    # another Popen's start, which the broker cannot count on: a SkyPilot-only broker starts none)
    assert state(server) in ("Z", None)
    watch.reap()
    assert state(server) is None and not watch.started
    assert bystander.wait(10) == 0  # its own Popen collects it
