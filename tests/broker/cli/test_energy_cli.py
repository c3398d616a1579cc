"""`spotbroker job ID` and `spotbroker costs` show the energy and emissions
beside the dollars, run as a user runs them against a real server."""
from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from conftest import ADMIN_TOKEN
from sqlalchemy import select
from support.cli import spotbroker
from support.helpers import team_token
from support.world import World

from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Attempt, Team


def test_job_and_costs_print_kwh_and_co2e(api, env, factory):
    token = team_token(api, "ml", ADMIN_TOKEN)
    world = World(factory)
    with factory() as s:
        ml = s.scalar(select(Team.id).where(Team.name == "ml"))
    now = datetime.now(UTC).replace(microsecond=0)
    job = world.job(ml, name="resnet", state="SUCCEEDED")
    a = world.attempt(job, start=now - timedelta(hours=3), end=now - timedelta(hours=1), price=3.0, nodes=2,
                      region="eu-north-1")
    with transaction(factory) as s:   # 2 h x 2 nodes x 2.5 kW = 10 kWh, x 40 g = 0.4 kg
        attempt = s.get(Attempt, a)
        attempt.power_kw, attempt.grid_g_per_kwh, attempt.grid_source, attempt.energy_basis = (
            2.5, 40.0, "eea", "measured")
    mine = {**env, "SPOTBROKER_TOKEN": token, "COLUMNS": "200"}

    r = spotbroker("job", str(job), env=mine)
    assert r.returncode == 0, r.stderr
    assert f"energy: 10.000 kWh, 0.400 kg CO2e; attempt {a}: 40 g/kWh (eea), measured" in r.stdout, r.stdout

    since = (now - timedelta(days=1)).isoformat()
    r = spotbroker("costs", "--since", since, "--group-by", "job", env=mine)
    assert r.returncode == 0, r.stderr
    assert "KWH" in r.stdout and "KG CO2E" in r.stdout and "10.0 kWh, 0.4 kg CO2e" in r.stdout
    row = next(line for line in r.stdout.splitlines() if "resnet" in line)
    assert "10.00" in row and "0.400" in row, row
    r = spotbroker("costs", "--since", since, "--json", env=mine)
    total = json.loads(r.stdout)["total"]
    assert total["kwh"] == pytest.approx(10.0) and total["co2e_kg"] == pytest.approx(0.4)
