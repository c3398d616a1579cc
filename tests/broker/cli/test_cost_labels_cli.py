"""`spotbroker costs --group-by label:KEY` and `--csv`, and a job's labels
in `spotbroker job`, run as a user runs them against a real server: the
CLI prints what the API answers."""
from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta

import pytest
from conftest import ADMIN_TOKEN
from sqlalchemy import select
from support.cli import spotbroker
from support.helpers import team_token
from support.world import World

from spotbroker.broker.store.models import Team


def test_costs_by_label_as_a_table_json_and_csv(api, env, factory):
    token = team_token(api, "ml", ADMIN_TOKEN)
    world = World(factory)
    with factory() as s:
        ml = s.scalar(select(Team.id).where(Team.name == "ml"))
    now = datetime.now(UTC).replace(microsecond=0)
    for name, labels, price in (("llama-a", {"project": "llama", "owner": "ann"}, 3.0),
                                ("llama-b", {"project": "llama"}, 1.0), ("vit", {"project": "[red]vit"}, 2.0),
                                ("bare", None, 0.5), ("sneaky", {"project": "=1+2"}, 0.25)):
        job = world.job(ml, name=name, state="SUCCEEDED", labels=labels)
        world.attempt(job, start=now - timedelta(hours=3), end=now - timedelta(hours=1), price=price)
    mine = {**env, "SPOTBROKER_TOKEN": token, "COLUMNS": "160"}
    window = ("--since", (now - timedelta(days=1)).isoformat(), "--until", now.isoformat())

    r = spotbroker("costs", *window, "--group-by", "label:project", "--json", env=mine)
    assert r.returncode == 0, r.stderr
    printed = json.loads(r.stdout)
    assert {g["key"]: g["cost"] for g in printed["groups"]} == pytest.approx(
        {"llama": 8.0, "[red]vit": 4.0, "(none)": 1.0, "=1+2": 0.5})
    assert printed["group_by"] == "label:project"

    r = spotbroker("costs", *window, "--group-by", "label:project", env=mine)
    assert r.returncode == 0, r.stderr
    rows = {line.split("│")[1].strip(): line for line in r.stdout.splitlines() if line.count("│") > 3}
    assert {"llama", "[red]vit", "(none)", "=1+2", "total"} <= set(rows), r.stdout   # a value is never markup
    assert "8.00" in rows["llama"] and "13.50" in rows["total"] and "LABEL:PROJECT" in r.stdout

    r = spotbroker("costs", *window, "--group-by", "label:project", "--csv", env=mine)
    assert r.returncode == 0, r.stderr
    answered = api.get("/v1/teams/ml/costs.csv", params={"since": window[1], "until": window[3],
                                                        "group_by": "label:project"},
                       headers={"Authorization": f"Bearer {token}"})
    assert r.stdout == answered.text.replace("\r\n", "\n")        # text mode: the platform's line ends
    got = {row[4]: float(row[6]) for row in list(csv.reader(io.StringIO(r.stdout)))[1:]}
    assert got == pytest.approx({"llama": 8.0, "[red]vit": 4.0, "(none)": 1.0, "'=1+2": 0.5})

    for bad in ("label:", "week"):
        r = spotbroker("costs", "--group-by", bad, env=mine)
        assert r.returncode == 2 and "label:KEY" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = spotbroker("costs", "--group-by", "label:bad key", env=mine)
    assert r.returncode == 1 and "group_by" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_job_shows_its_labels(api, env, factory):
    token = team_token(api, "ml", ADMIN_TOKEN)
    mine = {**env, "SPOTBROKER_TOKEN": token, "COLUMNS": "160"}
    r = api.post("/v1/jobs", content=b"name: tagged\nresources:\n  labels: {project: llama, owner: "
                 b"ann}\nrun: echo hi\n", headers={"Authorization": f"Bearer {token}",
                                                   "Content-Type": "application/yaml"})
    assert r.status_code == 201, r.text
    out = spotbroker("job", str(r.json()["id"]), env=mine)
    assert out.returncode == 0, out.stderr
    assert "labels: owner=ann, project=llama" in out.stdout, out.stdout
    out = spotbroker("job", str(r.json()["id"]), "--json", env=mine)
    assert json.loads(out.stdout)["labels"] == {"owner": "ann", "project": "llama"}
