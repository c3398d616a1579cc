"""A broker process that is down when a job ends, for longer than the agent
once waited (20 s), then started again: the agent keeps its events on disk
and keeps delivering, so the broker gets every event and every log line,
once and in order, and the job is not run again."""
from __future__ import annotations

import time

import httpx
import pytest
from conftest import ADMIN_TOKEN
from sqlalchemy import select
from support import brokerproc
from support.brokerproc import broker_env
from support.helpers import wait_for

from spotbroker.broker.store.db import make_engine, make_session_factory
from spotbroker.broker.store.models import Event

pytestmark = pytest.mark.slow
OUTAGE_AFTER_EXIT = 28.0  # seconds the broker stays down after the trainer exited (the old limit: 20)


class BrokerProcess(brokerproc.BrokerProcess):
    def start(self) -> None:
        super().start()
        wait_for(self._ready, timeout=120, interval=0.2, what="the broker to start")

    def _ready(self) -> bool:
        assert self.proc.poll() is None, self.output()[-2000:]
        return self.ready()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()  # down at once, as a crash or a lost host would be


def test_a_broker_down_at_the_jobs_end_gets_every_event_once_when_back(db_url, data_dir, job_scratch, tmp_path):
    env = broker_env(SPOTBROKER_DATABASE_URL=db_url, SPOTBROKER_DATA_DIR=str(data_dir),
                     SPOTBROKER_ADMIN_TOKEN=ADMIN_TOKEN, SPOTBROKER_RECONCILE_INTERVAL="0.2",
                     # Shorter than the outage: the broker that comes back must not take the node,
                     # silent while the broker was down, for lost (and run the job again).
                     SPOTBROKER_HEARTBEAT_TIMEOUT=str(OUTAGE_AFTER_EXIT - 8))
    broker = BrokerProcess(env, tmp_path / "broker.log")
    broker.start()
    try:
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        token = httpx.post(f"{broker.url}/v1/teams", json={"name": "ml"}, headers=admin).json()["token"]
        h = {"Authorization": f"Bearer {token}"}
        go, done = job_scratch / "go", job_scratch / "done"
        run = (f"echo first line; while [ ! -e {go} ]; do sleep 0.1; done; "
               f"for i in 1 2 3; do echo line $i; done; touch {done}; exit 3")
        job_id = httpx.post(f"{broker.url}/v1/jobs", json={"run": run, "max_restarts": 0}, headers=h).json()["id"]

        def job() -> dict:
            return httpx.get(f"{broker.url}/v1/jobs/{job_id}", headers=h, timeout=10).json()

        wait_for(lambda: job()["state"] == "RUNNING", timeout=120, what="the job to run")
        broker.stop()
        go.touch()  # the job ends while the broker is down
        wait_for(done.exists, timeout=60, what="the trainer to end")
        time.sleep(OUTAGE_AFTER_EXIT)
        broker.start()
        final = wait_for(lambda: (j := job())["state"] in ("SUCCEEDED", "FAILED") and j, timeout=120,
                         what="the job to end")
        assert final["state"] == "FAILED" and len(final["attempts"]) == 1
        # The agent sends events and output on two channels, each with its own back-off: the
        # job can end (its trainer_exited came in) before the output does. The agent exits
        # once it has delivered both, and its node then records the exit.
        exit_file = data_dir / "runs" / str(final["attempts"][0]["id"]) / "exit-0"
        wait_for(exit_file.exists, timeout=60, what="the agent to deliver everything and exit")
        logs = httpx.get(f"{broker.url}/v1/jobs/{job_id}/logs", headers=h).text
        assert "first line\n" in logs and "line 3\n" in logs
    finally:
        broker.stop()
    engine = make_engine(db_url)
    with make_session_factory(engine)() as s:
        events = list(s.scalars(select(Event).where(Event.job_id == job_id).order_by(Event.id)))
    engine.dispose()
    agent = [e for e in events if "agent_at" in e.data]
    exited = [e.data for e in agent if e.type == "trainer_exited"]
    assert [d["exit_code"] for d in exited] == [3]  # delivered, once
    assert [e.type for e in agent].count("trainer_started") == 1
    stamps = [e.data["agent_at"] for e in agent]
    assert stamps == sorted(stamps)  # stored in the order the agent reported them
