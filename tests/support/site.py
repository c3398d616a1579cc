"""A broker on a real socket, on a clock that stands still (so the page and
the API are read at the same instant), with two teams' money seeded in its
ledger's tables: jobs whose attempts ran on three clouds, one reclaimed
after a checkpoint, one still running, and one job whose name (and label)
is a script; the jobs carry labels (`project`, `owner`), and each attempt
its power and grid figures (`FOOTPRINT`), so kWh and CO2e accrue too."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import httpx
import pytest
import uvicorn
from conftest import ADMIN_TOKEN
from sqlalchemy import select

from spotbroker.broker.money.accrual import Accruer
from spotbroker.broker.money.settings import MoneySettings
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Attempt, Checkpoint, Team
from support.helpers import serve_in_thread
from support.world import T0, FakeClock, World

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
HOSTILE = "<script>document.body.dataset.pwned='yes'</script><img src=x onerror=\"document.title='pwned'\">"
HOSTILE_LABEL = "<script>document.body.dataset.pwned='label'</script>"      # a label's value has no spaces
H = timedelta(hours=1)
# Each attempt's power per node (kW), grid intensity (g CO2e/kWh), its source and basis, by cloud.
FOOTPRINT = {"aws": (6.5, 380.0, "eia", "estimated"), "gcp": (5.2, 420.0, "gcp", "measured"),
             "azure": (3.4, 360.0, "azure", "estimated")}


@dataclass
class Site:
    url: str
    client: httpx.Client
    clock: FakeClock
    tokens: dict[str, str]

    def bearer(self, team: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[team]}"}


def serve(settings, clock) -> tuple[uvicorn.Server, threading.Thread]:
    return serve_in_thread(settings, clock=clock, run_reconciler=False)


def seed(factory, team_ids: dict[str, int]) -> None:
    world = World(factory)
    ml, vision = team_ids["ml"], team_ids["vision"]
    pretrain = world.job(ml, "pretrain-llama", labels={"project": "llama", "owner": "ann"})
    first = world.attempt(pretrain, start=T0 - 72 * H, end=T0 - 44 * H, price=12.0, nodes=2,
                          end_reason="preempted")
    world.checkpoint(pretrain, first, T0 - 46 * H)
    world.attempt(pretrain, start=T0 - 43 * H, end=T0 - 20 * H, price=9.5, nodes=2, cloud="gcp",
                  region="us-central1", zone_id="us-central1-a", instance_type="a2-highgpu-8g")
    finetune = world.job(ml, "finetune-h100", labels={"project": "llama"})
    world.attempt(finetune, start=T0 - 18 * H, price=40.0, spot=False, instance_type="p5.48xlarge",
                  accelerator="H100", zone_id="use1-az2")       # still running
    hostile = world.job(ml, HOSTILE, labels={"project": HOSTILE_LABEL})
    world.attempt(hostile, start=T0 - 9 * H, end=T0 - 5 * H, price=3.1, cloud="azure", region="eastus",
                  zone_id="1", instance_type="Standard_ND40rs_v2", accelerator="V100")
    old = world.job(ml, "last-month")
    world.attempt(old, start=T0 - 40 * 24 * H, end=T0 - 39 * 24 * H, price=5.0)   # outside 30 days
    other = world.job(vision, "resnet", labels={"project": "vision-secret"})
    world.attempt(other, start=T0 - 30 * H, end=T0 - 26 * H, price=2.0, cloud="gcp", region="us-central1",
                  zone_id="us-central1-b", instance_type="g2-standard-8", accelerator="L4")
    with transaction(factory) as s:
        s.add(Checkpoint(job_id=pretrain, attempt_id=first, step=2, uri="s3://ckpt/ml/2", bytes=5 * 1024 ** 3,
                         keep=True, committed_at=T0 - 45 * H))
        for a in s.scalars(select(Attempt)):
            a.power_kw, a.grid_g_per_kwh, a.grid_source, a.energy_basis = FOOTPRINT[a.cloud]


@pytest.fixture
def site(settings, factory) -> Iterator[Site]:
    clock = FakeClock(T0)
    server, thread = serve(settings, clock)
    url = f"http://127.0.0.1:{settings.port}"
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            tokens = {}
            for name in ("ml", "vision"):
                r = client.post("/v1/teams", json={"name": name}, headers=ADMIN)
                assert r.status_code == 201, r.text
                tokens[name] = r.json()["token"]
            with factory() as s:
                ids = dict(s.execute(select(Team.name, Team.id)).all())
            seed(factory, ids)
            # The ledger written as the broker's accrual keeps it (at most a minute behind).
            Accruer(factory, MoneySettings(_env_file=None), clock=clock, owner="seed").accrue(T0)
            r = client.put("/v1/teams/ml/budget", json={"amount": 2500, "period": "month"}, headers=ADMIN)
            assert r.status_code == 200, r.text
            yield Site(url, client, clock, tokens)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
