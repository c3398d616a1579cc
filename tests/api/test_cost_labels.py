"""Allocation by label: a job's `resources.labels` (SkyPilot's key), given in
JSON or in a task file, is recorded on the job and shown with it; costs
group by any label (`group_by=label:KEY`, jobs without it under "(none)"),
each team over its own jobs only; `costs.csv` exports the same groups; bad
labels and bad groupings are 422s naming the field."""
from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta

import pytest
from conftest import ADMIN_TOKEN
from support.helpers import team_token

from spotbroker.broker.jobs import resfields
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Attempt

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
YAML = {"Content-Type": "application/yaml"}


def ran(factory, job_id: int, hours: float, price: float, running: bool = False) -> None:
    """The job ran `hours` on one node at `price` an hour, ending an hour ago (or running to now)."""
    now = datetime.now(UTC)
    start = now - timedelta(hours=hours + (0 if running else 1))
    end = None if running else start + timedelta(hours=hours)
    with transaction(factory) as s:
        s.add(Attempt(job_id=job_id, state="RUNNING" if running else "SUCCEEDED", launcher="local", cloud="aws",
                      region="us-east-1", zone_id="use1-az1", instance_type="p4d.24xlarge", accelerator="A100",
                      accelerator_count=8, use_spot=False, num_nodes=1, price_per_hour=price, created_at=start,
                      updated_at=start, started_at=start, ended_at=end,
                      end_reason=None if running else "succeeded", released=not running))


@pytest.fixture
def teams(agent_endpoint):
    """Teams a and b (the API without its reconciler: submitted jobs stay PENDING)."""
    return {name: {"Authorization": f"Bearer {team_token(agent_endpoint, name, ADMIN_TOKEN)}"}
            for name in ("a", "b")}


def submit(api, headers, name: str, labels: dict | None = None) -> int:
    spec = {"name": name, "run": "true", **({"resources": {"labels": labels}} if labels else {})}
    r = api.post("/v1/jobs", json=spec, headers=headers)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def costs(api, team: str, headers, group_by: str, **params) -> dict[str, float]:
    r = api.get(f"/v1/teams/{team}/costs", params={"group_by": group_by, **params}, headers=headers)
    assert r.status_code == 200, r.text
    assert sum(g["cost"] for g in r.json()["groups"]) == pytest.approx(r.json()["total"]["cost"])
    return {g["key"]: g["cost"] for g in r.json()["groups"]}


def test_labels_from_json_and_a_task_file_are_kept_on_the_job(agent_endpoint, teams):
    api = agent_endpoint
    job = submit(api, teams["a"], "llama", {"project": "llama", "owner": "ann"})
    r = api.post("/v1/jobs", content=b"name: vit\nresources:\n  labels:\n    project: vit\n    owner: bo\n"
                 b"run: echo hi\n", headers={**teams["a"], **YAML})
    assert r.status_code == 201, r.text
    assert r.json()["labels"] == {"owner": "bo", "project": "vit"}
    shown = api.get(f"/v1/jobs/{job}", headers=teams["a"]).json()
    assert shown["labels"] == {"owner": "ann", "project": "llama"}
    assert shown["spec"]["resources"]["labels"] == {"project": "llama", "owner": "ann"}   # SkyPilot's, passed on
    # With alternatives, an alternative's labels add to the top level's (as SkyPilot reads them), and the
    # job's labels are those every alternative carries.
    r = api.post("/v1/jobs", json={"run": "true", "resources": {"labels": {"project": "x"}, "any_of": [
        {"accelerators": "A100:1", "labels": {"pool": "big"}}, {"accelerators": "L4:1"}]}}, headers=teams["a"])
    assert r.status_code == 201, r.text
    assert r.json()["labels"] == {"project": "x"}
    assert r.json()["spec"]["resources"]["any_of"][0]["labels"] == {"project": "x", "pool": "big"}
    assert api.get("/v1/jobs", headers=teams["a"]).json()["jobs"][0]["labels"] == {"project": "x"}


def test_top_level_labels_are_refused_saying_where_they_go(agent_endpoint, teams):
    """SkyPilot's key is resources.labels; a top-level `labels:` is a 422 naming it, in JSON and in a file."""
    r = agent_endpoint.post("/v1/jobs", json={"run": "true", "labels": {"project": "x"}}, headers=teams["a"])
    assert r.status_code == 422 and r.json()["errors"] == [
        {"field": "labels", "message": resfields.MISPLACED_LABELS}], r.text
    r = agent_endpoint.post("/v1/jobs", content=b"run: echo hi\nlabels:\n  project: x\n",
                            headers={**teams["a"], **YAML})
    assert r.status_code == 422 and r.json()["errors"] == [
        {"field": "labels", "message": resfields.MISPLACED_LABELS, "line": 2}], r.text


@pytest.mark.parametrize("labels, words", [
    ({"project": "has space"}, "without spaces"),
    ({"bad key!": "x"}, "label's name"),
    ({"aws:name": "x"}, "label's name"),
    ({"project": {"a": 1}}, "a string"),
    ({"project": "x" * 256}, "at most 255"),
    ({"k" * 128: "x"}, "at most 127"),
    ({"project": "(none)"}, "without the label"),  # it was counted with the jobs that carry no such label
])
def test_a_bad_label_is_a_422_naming_the_field_in_json_and_in_a_task_file(agent_endpoint, teams, labels, words):
    api = agent_endpoint
    r = api.post("/v1/jobs", json={"run": "true", "resources": {"labels": labels}}, headers=teams["a"])
    assert r.status_code == 422, r.text
    assert any(e["field"].startswith("resources.labels") and words in e["message"] for e in r.json()["errors"]), \
        r.json()
    import yaml

    text = yaml.safe_dump({"run": "echo hi", "resources": {"labels": labels}}).encode()
    r = api.post("/v1/jobs", content=text, headers={**teams["a"], **YAML})
    assert r.status_code == 422, r.text
    (err,) = r.json()["errors"]
    assert err["field"].startswith("resources.labels") and err.get("line"), err


def test_costs_group_by_a_label_and_a_team_sees_only_its_own_jobs(agent_endpoint, teams, factory):
    api, a, b = agent_endpoint, teams["a"], teams["b"]
    ran(factory, submit(api, a, "l1", {"project": "llama", "owner": "ann"}), hours=2, price=6.0)    # $12
    ran(factory, submit(api, a, "l2", {"project": "llama"}), hours=1, price=2.0, running=True)      # $2, to now
    ran(factory, submit(api, a, "v1", {"project": "vit"}), hours=1, price=5.0)                      # $5
    ran(factory, submit(api, a, "bare"), hours=1, price=3.0)                                        # $3
    ran(factory, submit(api, b, "theirs", {"project": "llama"}), hours=1, price=100.0)
    ran(factory, submit(api, b, "hidden", {"project": "secret-thing", "owner": "zed"}), hours=1, price=7.0)

    mine = costs(api, "a", a, "label:project")
    assert mine == pytest.approx({"llama": 14.0, "vit": 5.0, "(none)": 3.0}, abs=0.01)
    assert costs(api, "a", a, "label:owner") == pytest.approx({"ann": 12.0, "(none)": 10.0}, abs=0.01)
    assert costs(api, "a", a, "label:nobody-has-it") == pytest.approx({"(none)": 22.0}, abs=0.01)
    assert costs(api, "a", ADMIN, "label:project") == pytest.approx(mine, abs=0.01)
    assert costs(api, "b", b, "label:project") == pytest.approx({"llama": 100.0, "secret-thing": 7.0}, abs=0.01)
    assert costs(api, "b", b, "label:owner") == pytest.approx({"zed": 7.0, "(none)": 100.0}, abs=0.01)
    # The label's other team never shows: a's token reads neither b's costs nor b's CSV.
    for path in ("/v1/teams/b/costs", "/v1/teams/b/costs.csv"):
        assert api.get(path, params={"group_by": "label:project"}, headers=a).status_code == 403
    since = (datetime.now(UTC) - timedelta(minutes=30)).isoformat()   # the running job's last half hour (to a minute)
    assert costs(api, "a", a, "label:project", since=since) == pytest.approx({"llama": 1.0}, abs=0.05)


@pytest.mark.parametrize("group_by", ["label:", "label", "label:bad key", "label:a,b", "week", "label:" + "k" * 130,
                                      "label:project\n"])  # a final newline is no part of a name
def test_a_bad_grouping_is_a_422_naming_group_by(agent_endpoint, teams, group_by):
    for path in ("/v1/teams/a/costs", "/v1/teams/a/costs.csv"):
        r = agent_endpoint.get(path, params={"group_by": group_by}, headers=teams["a"])
        assert r.status_code == 422, (path, r.text)
        assert [e["field"] for e in r.json()["errors"]] == ["group_by"], r.json()


def test_costs_csv_is_the_groups_quoted_and_inert_in_a_spreadsheet(agent_endpoint, teams, factory):
    api, a = agent_endpoint, teams["a"]
    ran(factory, submit(api, a, "f1", {"project": "=HYPERLINK(\"http://x\",\"y\")"}), hours=1, price=4.0)
    ran(factory, submit(api, a, "f2", {"project": "@SUM(A1:A9)"}), hours=1, price=1.5)
    ran(factory, submit(api, a, "f3", {"project": "-2+3"}), hours=1, price=1.0)
    ran(factory, submit(api, a, "f4", {"project": "+1"}), hours=1, price=1.0)
    ran(factory, submit(api, a, "q", {"project": 'a,b"c'}), hours=1, price=2.0)
    ran(factory, submit(api, a, "bare"), hours=1, price=0.25)

    r = api.get("/v1/teams/a/costs.csv", params={"group_by": "label:project"}, headers=a)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/csv")
    assert 'filename="costs-a.csv"' in r.headers["content-disposition"]
    assert r.text.endswith("\r\n") and "\n" not in r.text.replace("\r\n", "")        # CRLF line ends (RFC 4180)
    assert '"a,b""c"' in r.text                                                   # quoted, the quote doubled
    rows = list(csv.reader(io.StringIO(r.text)))
    assert rows[0] == ["team", "since", "until", "group_by", "key", "name", "cost", "on_demand_cost", "savings",
                       "wasted", "node_hours", "currency", "kwh", "co2e_kg"]
    got = {row[4]: row for row in rows[1:]}
    assert set(got) == {"'=HYPERLINK(\"http://x\",\"y\")", "'@SUM(A1:A9)", "'-2+3", "'+1", 'a,b"c', "(none)"}
    answered = api.get("/v1/teams/a/costs", params={"group_by": "label:project", "until": rows[1][2],
                                                    "since": rows[1][1]}, headers=a).json()
    for g in answered["groups"]:
        row = got[("'" + g["key"]) if g["key"][0] in "=+-@" else g["key"]]
        assert row[:4] == ["a", rows[1][1], rows[1][2], "label:project"]
        assert float(row[6]) == pytest.approx(g["cost"], abs=1e-6) and row[11] == "USD"
        assert float(row[10]) == pytest.approx(1.0)
    # Ungrouped: one total row; by job: the job's name beside its id.
    rows = list(csv.reader(io.StringIO(api.get("/v1/teams/a/costs.csv", headers=a).text)))
    assert [r[4] for r in rows[1:]] == ["total"] and float(rows[1][6]) == pytest.approx(9.75)
    rows = list(csv.reader(io.StringIO(api.get("/v1/teams/a/costs.csv", params={"group_by": "job"},
                                               headers=a).text)))
    assert sorted(r[5] for r in rows[1:]) == ["bare", "f1", "f2", "f3", "f4", "q"]
    assert api.get("/v1/teams/a/costs.csv").status_code == 401
