"""A team cannot starve the broker with task files: SkyPilot YAML is parsed
in pure Python holding the GIL (seconds a megabyte), so only a few are
parsed at once; the others wait their turn without a thread."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from support.teamgate import OtherTeamFirst

from spotbroker.broker.usecases import taskyaml

YAML_PARSES = 2  # spotbroker.api.routers.jobs.YAML_PARSES


def test_task_files_are_parsed_a_few_at_a_time(api, team_headers, monkeypatch):
    h = {**team_headers("ml"), "Content-Type": "application/yaml"}
    real, lock = taskyaml.parse_warned, threading.Lock()
    now = peak = 0

    def slow_parse(data: bytes):
        nonlocal now, peak
        with lock:
            now += 1
            peak = max(peak, now)
        time.sleep(0.3)
        with lock:
            now -= 1
        return real(data)

    monkeypatch.setattr(taskyaml, "parse_warned", slow_parse)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: api.post("/v1/jobs", content=f"name: j{i}\nrun: 'true'\n", headers=h),
                                range(8)))
    assert [r.status_code for r in answers] == [201] * 8
    assert 1 <= peak <= YAML_PARSES


def test_an_environment_or_command_no_node_could_start_is_refused_naming_the_field_and_the_bound(
        api, team_headers):
    """A 900 KB env value or a 200 KB setup passed, and the node died with
    E2BIG before it recorded anything: the bounds are checked at submission."""
    from spotbroker.broker.jobs.execlimits import MAX_COMMAND_BYTES, MAX_ENV_BYTES

    h = team_headers("ml")
    cases = [({"run": "true", "envs": {"BIG": "x" * 900_000}}, "envs", MAX_ENV_BYTES),
             ({"run": "true", "envs": {f"V{i}": "x" * 10_000 for i in range(7)}}, "envs", MAX_ENV_BYTES),
             ({"run": "true", "secrets": {"TOKEN": "s" * 70_000}}, "secrets", MAX_ENV_BYTES),
             ({"run": "true", "setup": "x" * 200_000}, "setup", MAX_COMMAND_BYTES),
             ({"run": "echo " + "x" * MAX_COMMAND_BYTES}, "run", MAX_COMMAND_BYTES)]
    for body, field, bound in cases:
        r = api.post("/v1/jobs", json=body, headers=h)
        assert r.status_code == 422, (field, r.text[:300])
        [error] = r.json()["errors"]
        assert error["field"] == field and f"at most {bound}" in error["message"], error
        assert "s" * 100 not in r.text  # a secret's value is never answered back
    task = ("resources:\n  accelerators: T4:1\n  use_spot: true\nsetup: |\n  " + "x" * 200_000 + "\nrun: python t.py\n")
    r = api.post("/v1/jobs", content=task, headers={**h, "Content-Type": "application/yaml"})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "setup", r.text[:300]
    assert api.get("/v1/jobs", headers=h).json()["jobs"] == []  # nothing was stored
    # At the bounds, a job is taken.
    fits = {"run": "true", "setup": "#" * MAX_COMMAND_BYTES, "envs": {"A": "x" * (MAX_ENV_BYTES - 4)}}
    assert api.post("/v1/jobs", json=fits, headers=h).status_code == 201


def test_a_team_parses_one_task_file_at_a_time_so_another_teams_file_is_not_kept_waiting(
        api, team_headers, monkeypatch):
    """Four loops of one team's slow task file (a megabyte of `envs:` keys)
    held both places and kept another team's file waiting 5-12 s: a team's
    files now wait for each other, not for the places."""
    ml = {**team_headers("ml"), "Content-Type": "application/yaml"}
    cv = {**team_headers("cv"), "Content-Type": "application/yaml"}
    gate = OtherTeamFirst(taskyaml.parse_warned, lambda data: "cv" if b"name: cv" in data else "ml")
    monkeypatch.setattr(taskyaml, "parse_warned", gate)
    with ThreadPoolExecutor(5) as pool:
        mls = [pool.submit(api.post, "/v1/jobs", content=f"name: ml{i}\nrun: 'true'\n", headers=ml) for i in range(4)]
        time.sleep(0.5)  # ml's files are in first
        answer = api.post("/v1/jobs", content="name: cv\nrun: 'true'\n", headers=cv)
        assert answer.status_code == 201, answer.text
        assert [f.result().status_code for f in mls] == [201] * 4
    assert not gate.stalled, "another team's task file waited behind this team's"
    assert gate.peak == {"ml": 1, "cv": 1}


def test_a_team_has_at_most_so_many_unfinished_jobs(api, settings, team_headers):
    """3,000 of one team's pending jobs kept the reconciler 80 s behind for
    every team: past SPOTBROKER_MAX_UNFINISHED_JOBS_PER_TEAM a submission is
    refused (429) before its spec is read, and nothing is stored."""
    settings.max_unfinished_jobs_per_team = 2
    ml, cv = team_headers("ml"), team_headers("cv")
    waits = {"run": "true", "num_nodes": 9}  # HELD: the local launcher runs 8 nodes at once
    first = api.post("/v1/jobs", json=waits, headers={**ml, "Idempotency-Key": "first"})
    assert first.status_code == 201, first.text
    assert api.post("/v1/jobs", json=waits, headers=ml).status_code == 201
    refused = api.post("/v1/jobs", json=waits, headers=ml)
    assert refused.status_code == 429 and refused.headers["retry-after"] == "60", refused.text  # (a 429 says when)
    assert "2 unfinished jobs" in refused.json()["detail"]
    assert "SPOTBROKER_MAX_UNFINISHED_JOBS_PER_TEAM" in refused.json()["detail"]
    yaml = {**ml, "Content-Type": "application/yaml"}
    assert api.post("/v1/jobs", content="run: 'true'\n", headers=yaml).status_code == 429
    assert len(api.get("/v1/jobs", headers=ml).json()["jobs"]) == 2  # nothing stored
    # A retry of a submission that made its job gets that job.
    again = api.post("/v1/jobs", json=waits, headers={**ml, "Idempotency-Key": "first"})
    assert again.status_code == 201 and again.json()["id"] == first.json()["id"], again.text
    # Another team is not counted against; an ended job frees its place.
    assert api.post("/v1/jobs", json=waits, headers=cv).status_code == 201
    assert api.post(f"/v1/jobs/{first.json()['id']}/cancel", headers=ml).status_code == 200
    assert api.post("/v1/jobs", json=waits, headers=ml).status_code == 201
