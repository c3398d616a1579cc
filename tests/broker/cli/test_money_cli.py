"""`spotbroker costs` and `spotbroker budget set/show`, run as a user runs
them (a real process) against a real server: they print what the API
answers, and a refusal is a message, never a traceback."""
from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from conftest import ADMIN_TOKEN
from sqlalchemy import select
from support.cli import spotbroker
from support.helpers import team_token
from support.world import World

from spotbroker.broker.store.models import Team


def test_costs_prints_the_ledger_as_the_api_answers_it(api, env, factory):
    token = team_token(api, "ml", ADMIN_TOKEN)
    team_token(api, "cv", ADMIN_TOKEN)
    world = World(factory)
    with factory() as s:
        ml = s.scalar(select(Team.id).where(Team.name == "ml"))
    now = datetime.now(UTC).replace(microsecond=0)
    job = world.job(ml, name="resnet", state="SUCCEEDED")
    world.attempt(job, start=now - timedelta(hours=3), end=now - timedelta(hours=1), price=3.0, nodes=2)
    since = (now - timedelta(days=1)).isoformat()
    mine = {**env, "SPOTBROKER_TOKEN": token}

    r = spotbroker("costs", "--since", since, "--group-by", "job", "--json", env=mine)
    assert r.returncode == 0, r.stderr
    printed = json.loads(r.stdout)
    assert printed["total"]["cost"] == pytest.approx(12.0)          # 2 h x 2 nodes x $3
    assert [(g["key"], g["name"]) for g in printed["groups"]] == [(str(job), "resnet")]
    answered = api.get("/v1/teams/ml/costs", params={"since": since, "until": printed["until"], "group_by": "job"},
                       headers={"Authorization": f"Bearer {token}"}).json()
    assert printed["total"] == answered["total"] and printed["groups"] == answered["groups"]

    r = spotbroker("costs", "--since", since, "--group-by", "job", env={**mine, "COLUMNS": "160"})
    assert r.returncode == 0, r.stderr
    assert "team ml: $12.00" in r.stdout and "resnet" in r.stdout and "24.0" not in r.stdout
    assert "total" in r.stdout and "4.0" in r.stdout                 # node-hours

    r = spotbroker("costs", "--team", "ml", "--since", since, "--json",
                   env={**env, "SPOTBROKER_ADMIN_TOKEN": ADMIN_TOKEN})
    assert r.returncode == 0 and json.loads(r.stdout)["total"]["cost"] == pytest.approx(12.0)
    # both tokens exported (cv's and the admin's): another team is read with the admin's (was: refused)
    cv = {**env, "SPOTBROKER_TOKEN": team_token(api, "cv2", ADMIN_TOKEN), "SPOTBROKER_ADMIN_TOKEN": ADMIN_TOKEN}
    r = spotbroker("costs", "--team", "ml", "--since", since, "--json", env=cv)
    assert r.returncode == 0 and json.loads(r.stdout)["total"]["cost"] == pytest.approx(12.0), r.stderr
    r = spotbroker("alerts", "--team", "ml", "--json", env=cv)
    assert r.returncode == 0 and json.loads(r.stdout) == [], r.stderr
    for args, words in ((("--team", "cv"), "its own team"), (("--since", "yesterday"), "since")):
        r = spotbroker("costs", *args, env=mine)
        assert r.returncode == 1 and words in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = spotbroker("costs", "--group-by", "week", env=mine)
    assert r.returncode == 2 and "week" in r.stderr and "Traceback" not in r.stderr
    r = spotbroker("costs", "--csv", "--json", env=mine)  # (printed CSV, saying nothing)
    assert r.returncode == 2 and "--csv or --json, not both" in r.stderr

    # A short spot job's cents are shown, not 0.00 as if it ran for free.
    short = world.job(ml, name="probe", state="SUCCEEDED")
    world.attempt(short, start=now - timedelta(minutes=2), end=now - timedelta(minutes=1), price=0.05)
    r = spotbroker("costs", "--since", since, "--group-by", "job", env={**mine, "COLUMNS": "160"})
    assert r.returncode == 0 and f"{short} probe" in r.stdout, r.stdout
    row = next(line for line in r.stdout.splitlines() if f"{short} probe" in line)
    assert "0.0008" in row and "0.0167" in row, row  # $0.05/h for a minute; a minute in node-hours


def test_budget_set_and_show(api, env):
    token = team_token(api, "ml", ADMIN_TOKEN)
    admin = {**env, "SPOTBROKER_ADMIN_TOKEN": ADMIN_TOKEN}
    mine = {**env, "SPOTBROKER_TOKEN": token}

    r = spotbroker("budget", "show", "ml", env=admin)
    assert r.returncode == 1 and "no budget" in r.stderr and "Traceback" not in r.stderr
    r = spotbroker("budget", "set", "ml", "5000", "--period", "week", "--hard-cap", "stop_running", env=admin)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "team ml: budget $5000.00 per week, over it: stop_running"
    shown = json.loads(spotbroker("budget", "show", "--json", env=mine).stdout)  # the token's own team
    assert (shown["amount"], shown["period"], shown["hard_cap_action"]) == (5000, "week", "stop_running")
    assert shown == api.get("/v1/teams/ml/budget", headers={"Authorization": f"Bearer {token}"}).json()

    r = spotbroker("budget", "set", "ml", "8000", env=admin)                  # the period and hard cap are kept
    assert r.returncode == 0 and "$8000.00 per week, over it: stop_running" in r.stdout  # (was: per month)
    r = spotbroker("budget", "set", "ml", "-3", env=admin)                    # (was: "No such option: -3")
    assert r.returncode == 2 and "Invalid value for 'AMOUNT': -3.0 is not in the range x>0" in r.stderr, r.stderr
    r = spotbroker("budget", "set", "ml", "1", env=mine)                      # a team's token: refused
    assert r.returncode == 1 and "admin" in r.stderr and "Traceback" not in r.stderr
    assert json.loads(spotbroker("budget", "show", "ml", "--json", env=admin).stdout)["amount"] == 8000
    r = spotbroker("budget", "show", env=mine)                                # a table, like every command
    assert r.returncode == 0, r.stderr
    head, row = [line for line in r.stdout.splitlines() if "BUDGET $" in line or "8000.00" in line]
    assert "SPENT $" in head and "REMAINING $" in head
    assert [cell.strip() for cell in row.split("│")[1:4]] == ["ml", "8000.00", "week"]
    assert "stop_running" in row
    both = {**mine, "SPOTBROKER_ADMIN_TOKEN": ADMIN_TOKEN}                   # both exported: admin's is sent
    r = spotbroker("budget", "set", "ml", "9000", "--period", "month", env=both)
    assert r.returncode == 0 and "$9000.00 per month" in r.stdout, r.stderr
    r = spotbroker("budget", "show", "--json", env=both)                     # a team command: the team's own
    assert r.returncode == 0 and json.loads(r.stdout)["team"] == "ml"
    for bad in ("0", "-5", "lots", "nan", "inf"):  # (nan and inf were a traceback)
        r = spotbroker("budget", "set", "ml", bad, env=admin)
        assert r.returncode == 2 and "AMOUNT" in r.stderr and "Traceback" not in r.stderr
    r = spotbroker("budget", "show", "nobody", env=admin)
    assert r.returncode == 1 and "nobody" in r.stderr and "Traceback" not in r.stderr

