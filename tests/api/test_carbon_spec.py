"""The job spec's `carbon_price_per_tonne` through the API: a spotbroker key
in JSON and in a SkyPilot task file (taken out before SkyPilot reads it), a
422 naming the field on a bad value, and a team default under the job's own."""
from __future__ import annotations

import pytest
from conftest import ADMIN_TOKEN

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
YAML = "application/yaml"


def cancel(api, h, job_id: int) -> None:
    api.post(f"/v1/jobs/{job_id}/cancel", headers=h)


@pytest.mark.parametrize("value", [-1, "lots", 1e9, None])
def test_a_bad_carbon_price_is_a_422_naming_the_field(api, team_headers, value):
    h = team_headers()
    body = {"run": "true", "carbon_price_per_tonne": value}
    r = api.post("/v1/jobs", json=body, headers=h)
    if value is None:  # null is "not set": the default (0)
        assert r.status_code == 201, r.text
        cancel(api, h, r.json()["id"])
        return
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == "carbon_price_per_tonne", r.json()


def test_the_carbon_price_is_ours_in_json_and_in_a_task_file(api, team_headers):
    h = team_headers()
    r = api.post("/v1/jobs", json={"run": "sleep 30", "resources": {"accelerators": "T4:1"},
                                   "carbon_price_per_tonne": 100}, headers=h)
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["carbon_price_per_tonne"] == 100
    cancel(api, h, r.json()["id"])
    task = b"run: sleep 30\nresources:\n  accelerators: T4:1\ncarbon_price_per_tonne: 50\n"
    r = api.post("/v1/jobs", content=task, headers={**h, "Content-Type": YAML})
    assert r.status_code == 201, r.text  # SkyPilot's schema never saw the key
    assert r.json()["spec"]["carbon_price_per_tonne"] == 50 and r.json()["warnings"] == []
    cancel(api, h, r.json()["id"])
    bad = b"run: sleep 30\nresources:\n  accelerators: T4:1\ncarbon_price_per_tonne: -3\n"
    r = api.post("/v1/jobs", content=bad, headers={**h, "Content-Type": YAML})
    assert r.status_code == 422, r.text
    error = r.json()["errors"][0]
    assert error["field"] == "carbon_price_per_tonne" and error.get("line") == 4, error


def test_a_teams_carbon_price_is_the_default_of_its_jobs(api, team_headers):
    h = team_headers("green")
    r = api.put("/v1/teams/green/policy", json={"carbon_price_per_tonne": -5}, headers=ADMIN)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "carbon_price_per_tonne", r.text
    r = api.put("/v1/teams/green/policy", json={"carbon_price_per_tonne": 80}, headers=ADMIN)
    assert r.status_code == 200 and r.json()["carbon_price_per_tonne"] == 80, r.text
    given = {}
    for own in (None, 0, 200):
        body = {"run": "sleep 30", **({"carbon_price_per_tonne": own} if own is not None else {})}
        r = api.post("/v1/jobs", json=body, headers=h)
        assert r.status_code == 201, r.text
        given[own] = r.json()["spec"].get("carbon_price_per_tonne")
        cancel(api, h, r.json()["id"])
    assert given == {None: 80, 0: 0, 200: 200}  # the job's own value wins, 0 included
    task = b"run: sleep 30\n"
    r = api.post("/v1/jobs", content=task, headers={**h, "Content-Type": YAML})
    assert r.status_code == 201 and r.json()["spec"]["carbon_price_per_tonne"] == 80, r.text
    cancel(api, h, r.json()["id"])
