"""`preflight` in a job spec: `true`, or its own run, steps, timeout and
accelerators; a spotbroker key that a SkyPilot task file may carry (taken
out before SkyPilot's schema reads the file); a bad value is a 422 naming
the field."""
from __future__ import annotations

import pytest

JSON, YAML = "application/json", "application/yaml"


@pytest.mark.parametrize("body, ctype, want", [
    (b'{"run": "x", "preflight": true}', JSON, {"steps": 2, "timeout": 600}),
    (b'{"run": "x", "preflight": {"run": "python t.py --smoke", "steps": 3, "timeout": 60}}', JSON,
     {"run": "python t.py --smoke", "steps": 3, "timeout": 60}),
    (b"run: python t.py\npreflight: {accelerators: {T4: 1}}\nresources: {accelerators: A100:1}\n", YAML,
     {"steps": 2, "timeout": 600, "accelerators": "T4:1"}),
    (b"run: python t.py\npreflight: true\n", YAML, {"steps": 2, "timeout": 600}),
])
def test_a_preflight_is_stored_with_its_defaults(api, team_headers, body, ctype, want):
    h = team_headers()
    r = api.post("/v1/jobs", content=body, headers={**h, "Content-Type": ctype})
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["preflight"] == want
    api.post(f"/v1/jobs/{r.json()['id']}/cancel", headers=h)


def test_no_preflight_is_none(api, team_headers):
    h = team_headers()
    for body in (b'{"run": "x"}', b'{"run": "x", "preflight": false}'):
        r = api.post("/v1/jobs", content=body, headers={**h, "Content-Type": JSON})
        assert r.status_code == 201 and "preflight" not in r.json()["spec"], r.text
        api.post(f"/v1/jobs/{r.json()['id']}/cancel", headers=h)


@pytest.mark.parametrize("body, ctype, field, word", [
    (b'{"run": "x", "preflight": {"steps": 0}}', JSON, "preflight.steps", "1"),
    (b'{"run": "x", "preflight": {"timeout": 5}}', JSON, "preflight.timeout", "10"),
    (b'{"run": "x", "preflight": {"run": "  "}}', JSON, "preflight.run", "command"),
    (b'{"run": "x", "preflight": {"accelerators": "T4:0"}}', JSON, "preflight.accelerators", "count"),
    (b'{"run": "x", "preflight": {"stepz": 2}}', JSON, "preflight.stepz", "extra"),
    (b'{"run": "x", "preflight": "yes"}', JSON, "preflight", ""),
    (b"run: x\npreflight: {steps: -1}\n", YAML, "preflight.steps", "1"),
    (b"run: x\npreflight: {tiemout: 60}\n", YAML, "preflight.tiemout", "extra"),
])
def test_a_bad_preflight_is_a_422_naming_the_field(api, team_headers, body, ctype, field, word):
    r = api.post("/v1/jobs", content=body, headers={**team_headers(), "Content-Type": ctype})
    assert r.status_code == 422, r.text
    error = r.json()["errors"][0]
    assert error["field"] == field and word in error["message"].lower(), error


@pytest.mark.parametrize("ctype", [JSON, YAML])
def test_a_preflight_run_no_node_could_start_is_a_422_naming_it(api, team_headers, ctype):
    """A 300 KB `preflight.run` was taken, and every launch of its pre-flight
    then failed with "Argument list too long": it has the bound of `run`."""
    from spotbroker.broker.jobs.execlimits import MAX_COMMAND_BYTES

    h = team_headers()
    big = "x" * 300_000
    body = (f'{{"run": "true", "preflight": {{"run": "{big}"}}}}' if ctype == JSON
            else f"run: 'true'\npreflight:\n  run: {big}\n")
    r = api.post("/v1/jobs", content=body.encode(), headers={**h, "Content-Type": ctype})
    assert r.status_code == 422, r.text[:300]
    [error] = r.json()["errors"]
    assert error["field"] == "preflight.run" and f"at most {MAX_COMMAND_BYTES}" in error["message"], error
    assert api.get("/v1/jobs", headers=h).json()["jobs"] == []
    fits = {"run": "true", "preflight": {"run": "#" * MAX_COMMAND_BYTES}}  # at the bound, a job is taken
    r = api.post("/v1/jobs", json=fits, headers=h)
    assert r.status_code == 201, r.text[:300]
    api.post(f"/v1/jobs/{r.json()['id']}/cancel", headers=h)
