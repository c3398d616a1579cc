"""Team defaults and limits (`PUT /v1/teams/{team}/policy`), through the real
server and the local launcher: the admin sets them, the team reads them;
each limit refuses a job with a 422 naming the rule and the limit; default
envs reach the job's process; a lowered limit never stops what runs but
holds the next attempt, with the reason; the team's GPUs at once hold a
launch that would exceed them, and the submission's answer says so."""
from __future__ import annotations

from conftest import ADMIN_TOKEN
from support.helpers import spend_today, wait_for, wait_state

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def set_policy(api, team: str, **policy) -> dict:
    r = api.put(f"/v1/teams/{team}/policy", json=policy, headers=ADMIN)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_admin_sets_a_policy_the_team_reads_its_own_and_cannot_change_it(api, team_headers):
    a, b = team_headers("a"), team_headers("b")
    body = {"envs": {"MIXED_PRECISION": "bf16"}, "allowed_accelerators": ["T4", "L4"], "max_nodes": 2,
            "max_gpus_running": 8, "max_price_per_hour": 12.5, "checkpoint_retention_days": 30,
            "early_stop": {"metric": "val_loss", "patience": 3}, "checkpoint": {"interval": "auto"}}
    assert api.put("/v1/teams/a/policy", json=body, headers=a).status_code == 403   # not its own either
    assert api.get("/v1/teams/a/policy", headers=a).json() == {"team": "a", "envs": {}}  # nothing was written
    assert api.put("/v1/teams/nobody/policy", json=body, headers=ADMIN).status_code == 404
    shown = set_policy(api, "a", **body)
    assert shown["team"] == "a" and shown["max_nodes"] == 2 and shown["allowed_accelerators"] == ["T4", "L4"]
    # Checked by the spec's own rule, shown with its defaults filled in
    assert shown["early_stop"] == {"metric": "val_loss", "mode": "min", "patience": 3, "min_delta": 0.0,
                                   "min_steps": 0}
    mine = api.get("/v1/teams/a/policy", headers=a)
    assert mine.status_code == 200 and mine.json() == shown
    assert api.get("/v1/teams/a/policy", headers=b).status_code == 403
    assert api.get("/v1/teams/b/policy", headers=ADMIN).json() == {"team": "b", "envs": {}}


def test_a_policy_document_is_checked_field_by_field(api, team_headers):
    team_headers("a")
    for bad, field in (({"allowed_accelerators": ["A100:8"]}, "allowed_accelerators"),
                       ({"max_nodes": 0}, "max_nodes"),
                       ({"max_price_per_hour": -1}, "max_price_per_hour"),
                       ({"envs": {"SPOTBROKER_ATTEMPT_ID": "1"}}, "envs"),
                       ({"envs": {"1BAD": "x"}}, "envs"),
                       ({"checkpoint": {"interval": "sometimes"}}, "checkpoint.interval"),
                       ({"early_stop": {"mode": "min"}}, "early_stop.metric"),
                       ({"max_gpu": 8}, "max_gpu")):
        r = api.put("/v1/teams/a/policy", json=bad, headers=ADMIN)
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["errors"][0]["field"].startswith(field), (bad, r.json())


def test_each_limit_refuses_a_job_with_a_422_naming_the_rule_and_the_limit(api, team_headers):
    h = team_headers("ml")
    set_policy(api, "ml", allowed_accelerators=["T4", "L4"], max_nodes=2, max_gpus_running=4,
               max_price_per_hour=0.05)

    def refused(spec: dict, field: str) -> str:
        r = api.post("/v1/jobs", json={"run": "true", **spec}, headers=h)
        assert r.status_code == 422, r.text
        error = r.json()["errors"][0]  # (A100:8 also breaks the GPUs at once: that comes after)
        assert error["field"] == field, error
        return error["message"]

    assert refused({"resources": {"accelerators": "A100:8"}}, "resources.accelerators") == \
        "accelerators: A100:8 is not allowed for team ml (allowed_accelerators: T4, L4)"
    message = refused({"num_nodes": 3}, "num_nodes")
    assert "3 nodes" in message and "max_nodes" in message and "2 nodes per job" in message
    message = refused({"resources": {"accelerators": "T4:4"}, "num_nodes": 2}, "resources.accelerators")
    assert "8 GPUs at once" in message and "max_gpus_running" in message and "limit of 4" in message
    message = refused({"resources": {"accelerators": "T4:1"}}, "resources")
    assert message.startswith("max_price_per_hour: the cheapest place that fits costs $") and "$0.05/h" in message
    # A SkyPilot task file meets the same limits.
    r = api.post("/v1/jobs", content=b"run: 'true'\nresources:\n  accelerators: A100:8\n",
                 headers={**h, "Content-Type": "application/yaml"})
    assert r.status_code == 422 and "not allowed for team ml" in r.json()["errors"][0]["message"]
    # Within every limit once the price limit is raised.
    set_policy(api, "ml", allowed_accelerators=["T4", "L4"], max_nodes=2, max_gpus_running=4,
               max_price_per_hour=5)
    ok = api.post("/v1/jobs", json={"run": "true", "resources": {"accelerators": "T4:1"}}, headers=h)
    assert ok.status_code == 201 and ok.json()["warnings"] == []


def test_default_envs_reach_the_jobs_process_under_its_own(api, team_headers):
    h = team_headers("ml")
    set_policy(api, "ml", envs={"MIXED_PRECISION": "bf16", "WHO": "the team"})
    r = api.post("/v1/jobs", json={"run": "echo mp=$MIXED_PRECISION who=$WHO", "envs": {"WHO": "the job"}},
                 headers=h)
    assert r.status_code == 201 and r.json()["spec"]["envs"] == {"MIXED_PRECISION": "bf16", "WHO": "the job"}
    job = wait_state(api, h, r.json()["id"], TERMINAL, timeout=60)
    assert job["state"] == "SUCCEEDED", job
    assert "mp=bf16 who=the job" in api.get(f"/v1/jobs/{job['id']}/logs", headers=h).text
    # The same through a SkyPilot task file.
    r = api.post("/v1/jobs", content=b"run: echo mp=$MIXED_PRECISION\n",
                 headers={**h, "Content-Type": "application/yaml"})
    assert r.status_code == 201, r.text
    job = wait_state(api, h, r.json()["id"], TERMINAL, timeout=60)
    assert "mp=bf16" in api.get(f"/v1/jobs/{job['id']}/logs", headers=h).text


def test_a_lowered_limit_never_stops_what_runs_and_holds_its_next_attempt(api, team_headers):
    h = team_headers("ml")
    r = api.post("/v1/jobs", json={"run": "sleep 60", "resources": {"accelerators": "T4:1"}}, headers=h)
    job = wait_state(api, h, r.json()["id"], {"RUNNING"}, timeout=60)
    set_policy(api, "ml", allowed_accelerators=["L4"])
    assert api.get(f"/v1/jobs/{job['id']}", headers=h).json()["state"] == "RUNNING"  # not stopped
    wait_for(lambda: api.post(f"/v1/jobs/{job['id']}/simulate-preemption", headers=h).status_code == 202,
             timeout=30, what="the node's metadata simulator")
    held = wait_state(api, h, job["id"], {"HELD"}, timeout=60)
    assert held["reason"] == ("held by a limit: accelerators: T4:1 is not allowed for team ml "
                              "(allowed_accelerators: L4)")
    assert len(held["attempts"]) == 1
    set_policy(api, "ml", allowed_accelerators=["L4", "T4"])  # raised again: it resumes
    wait_state(api, h, job["id"], {"LAUNCHING", "RUNNING"}, timeout=60)
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)


def test_the_teams_gpus_at_once_hold_a_launch_and_the_answer_says_so(api, team_headers):
    h = team_headers("ml")
    set_policy(api, "ml", max_gpus_running=1)
    first = api.post("/v1/jobs", json={"run": "sleep 60", "resources": {"accelerators": "T4:1"}}, headers=h).json()
    wait_state(api, h, first["id"], {"RUNNING"}, timeout=60)
    r = api.post("/v1/jobs", json={"run": "echo second", "resources": {"accelerators": "T4:1"}}, headers=h)
    assert r.status_code == 201 and r.json()["state"] == "HELD"
    reason = "held by a limit: team max 1 GPUs at once, 1 running (it needs 1)"
    assert r.json()["reason"] == reason
    assert r.json()["warnings"] == [{"field": "state", "message": f"the job is HELD: {reason}", "line": None}]
    listed = api.get("/v1/jobs", headers=h).json()["jobs"]
    assert [j["reason"] for j in listed if j["id"] == r.json()["id"]] == [reason]
    api.post(f"/v1/jobs/{first['id']}/cancel", headers=h)  # its GPUs free: the held job runs
    done = wait_state(api, h, r.json()["id"], TERMINAL, timeout=60)
    assert done["state"] == "SUCCEEDED"


def test_a_gpu_preflight_over_the_teams_gpus_at_once_is_answered_held(api, team_headers):
    """The job's own GPUs fit, its pre-flight's (which launches first) do not:
    the answer said PENDING, and the reconciler held it a moment later."""
    h = team_headers("ml")
    set_policy(api, "ml", max_gpus_running=4)
    first = api.post("/v1/jobs", json={"run": "sleep 60", "resources": {"accelerators": "T4:1"}}, headers=h).json()
    wait_state(api, h, first["id"], {"RUNNING"}, timeout=60)
    r = api.post("/v1/jobs", json={"run": "echo main", "resources": {"accelerators": "T4:1"},
                                   "preflight": {"accelerators": "T4:4", "run": "echo pf"}}, headers=h)
    assert r.status_code == 201, r.text
    reason = "held by a limit: team max 4 GPUs at once, 1 running (its pre-flight needs 4)"
    assert (r.json()["state"], r.json()["reason"]) == ("HELD", reason), r.json()
    assert r.json()["warnings"] == [{"field": "state", "message": f"the job is HELD: {reason}", "line": None}]
    api.post(f"/v1/jobs/{first['id']}/cancel", headers=h)
    api.post(f"/v1/jobs/{r.json()['id']}/cancel", headers=h)


def test_a_budget_over_at_submission_answers_held_with_a_warning(api, team_headers, settings):
    h = team_headers("a")
    spend_today(settings, "a", 10.0)
    assert api.put("/v1/teams/a/budget", json={"amount": 5, "period": "day"}, headers=ADMIN).status_code == 200
    r = api.post("/v1/jobs", json={"name": "next", "run": "echo ran"}, headers=h)
    assert r.status_code == 201 and r.json()["state"] == "HELD"
    assert r.json()["reason"].startswith("over budget: $10.00 spent of $5.00 this day")
    (warning,) = r.json()["warnings"]
    assert warning["field"] == "state" and warning["message"].startswith("the job is HELD: over budget")
    yaml = api.post("/v1/jobs", content=b"run: echo ran\n", headers={**h, "Content-Type": "application/yaml"})
    assert yaml.json()["state"] == "HELD" and yaml.json()["warnings"][-1]["field"] == "state"
    wait_for(lambda: api.get(f"/v1/jobs/{r.json()['id']}", headers=h).json()["state"] == "HELD", timeout=5)


def test_spec_defaults_fill_what_a_job_leaves_out_and_are_checked_by_the_specs_rules(api, team_headers):
    h = team_headers("ml")
    set_policy(api, "ml", checkpoint={"interval": 900}, early_stop={"metric": "val_loss", "patience": 5})
    taken = api.post("/v1/jobs", json={"run": "sleep 30"}, headers=h).json()
    own = api.post("/v1/jobs", json={"run": "sleep 30", "checkpoint": {"interval": "code"}}, headers=h).json()
    for job_id, interval in ((taken["id"], 900), (own["id"], "code")):
        spec = api.get(f"/v1/jobs/{job_id}", headers=h).json()["spec"]
        assert spec["checkpoint"]["interval"] == interval and spec["early_stop"]["patience"] == 5
        api.post(f"/v1/jobs/{job_id}/cancel", headers=h)
    # A default the spec would refuse is refused when it is set, naming the field.
    r = api.put("/v1/teams/ml/policy", json={"checkpoint": {"interval": "sometimes"}}, headers=ADMIN)
    assert r.status_code == 422 and "checkpoint.interval" in r.text, r.text


def test_a_job_switches_off_its_teams_default_early_stop_with_false(api, team_headers):
    """`early_stop: false` was a 422 under a team default: it is none, as `preflight: false` is."""
    h = team_headers("ml")
    set_policy(api, "ml", early_stop={"metric": "val_loss", "patience": 5}, preflight=True)
    r = api.post("/v1/jobs", json={"run": "sleep 30", "early_stop": False, "preflight": False}, headers=h)
    assert r.status_code == 201, r.text
    task = b"run: sleep 30\nearly_stop: false\n"
    y = api.post("/v1/jobs", content=task, headers={**h, "Content-Type": "application/yaml"})
    assert y.status_code == 201, y.text
    for job_id in (r.json()["id"], y.json()["id"]):
        spec = api.get(f"/v1/jobs/{job_id}", headers=h).json()["spec"]
        assert "early_stop" not in spec, spec
        api.post(f"/v1/jobs/{job_id}/cancel", headers=h)
    # Left out (or null), the default holds; `true` names no metric: refused, naming the field.
    taken = api.post("/v1/jobs", json={"run": "sleep 30", "early_stop": None, "preflight": False}, headers=h).json()
    assert api.get(f"/v1/jobs/{taken['id']}", headers=h).json()["spec"]["early_stop"]["patience"] == 5
    api.post(f"/v1/jobs/{taken['id']}/cancel", headers=h)
    bad = api.post("/v1/jobs", json={"run": "sleep 30", "early_stop": True}, headers=h)
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"].startswith("early_stop"), bad.text


def test_a_preflights_own_accelerators_meet_the_teams_limits_at_submission(api, team_headers):
    """A pre-flight on A100:8 was taken from a team allowed one T4, and ran on
    a p4d.24xlarge: its accelerators are refused as the job's own are."""
    h = team_headers("beta")
    set_policy(api, "beta", allowed_accelerators=["T4"], max_gpus_running=1, max_price_per_hour=1.0, max_nodes=1)

    def refused(preflight: str) -> list[dict]:
        r = api.post("/v1/jobs", json={"name": "pf", "run": "sleep 300", "preflight": {"accelerators": preflight},
                                       "resources": {"accelerators": "T4:1"}}, headers=h)
        assert r.status_code == 422, r.text
        assert {e["field"] for e in r.json()["errors"]} == {"preflight.accelerators"}, r.json()
        return [e["message"] for e in r.json()["errors"]]

    assert refused("A100:8") == [
        "preflight.accelerators: A100:8 is not allowed for team beta (allowed_accelerators: T4)",
        "preflight.accelerators: the pre-flight needs 8 GPUs at once, over team beta's limit of 1 GPUs at once "
        "(max_gpus_running)"]
    [message] = refused("T4:4")
    assert "needs 4 GPUs at once" in message and "max_gpus_running" in message
    # A SkyPilot task file meets the same limits.
    task = b"name: pf\nrun: sleep 300\nresources:\n  accelerators: T4:1\npreflight:\n  accelerators: A100:8\n"
    r = api.post("/v1/jobs", content=task, headers={**h, "Content-Type": "application/yaml"})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "preflight.accelerators", r.text
    assert "not allowed for team beta" in r.json()["errors"][0]["message"]
    # Its price too: the cheapest place with 8 A100s is over $1/h.
    set_policy(api, "beta", allowed_accelerators=["T4", "A100"], max_gpus_running=8, max_price_per_hour=1.0)
    [message] = refused("A100:8")
    assert message.startswith("max_price_per_hour: the cheapest place that fits costs $") and \
        "for its pre-flight" in message and "$1.00/h" in message, message
    assert api.get("/v1/jobs", headers=h).json()["jobs"] == []  # nothing was stored
    ok = api.post("/v1/jobs", json={"run": "true", "preflight": {"accelerators": "T4:1"},
                                    "resources": {"accelerators": "T4:1"}}, headers=h)
    assert ok.status_code == 201, ok.text
    api.post(f"/v1/jobs/{ok.json()['id']}/cancel", headers=h)


def test_a_limit_lowered_since_submission_holds_a_preflight_it_forbids(api, team_headers):
    """A pre-flight's own place met none of the team's limits before it
    launched: a job whose pre-flight a lowered limit forbids is held, with the
    reason, and runs once the limit is raised again."""
    h = team_headers("ml")
    set_policy(api, "ml", allowed_accelerators=["T4", "L4"], max_gpus_running=1)
    first = api.post("/v1/jobs", json={"run": "sleep 60", "resources": {"accelerators": "T4:1"}}, headers=h).json()
    wait_state(api, h, first["id"], {"RUNNING"}, timeout=60)
    r = api.post("/v1/jobs", json={"run": "echo main", "resources": {"accelerators": "L4:1"},
                                   "preflight": {"accelerators": "T4:1", "run": "echo pf"}}, headers=h)
    assert r.status_code == 201 and r.json()["state"] == "HELD", r.text  # (the GPUs at once, for now)
    set_policy(api, "ml", allowed_accelerators=["L4"], max_gpus_running=1)
    api.post(f"/v1/jobs/{first['id']}/cancel", headers=h)
    reason = ("held by a limit: preflight.accelerators: T4:1 is not allowed for team ml "
              "(allowed_accelerators: L4)")
    held = wait_for(lambda: (j := api.get(f"/v1/jobs/{r.json()['id']}", headers=h).json())["reason"] == reason
                    and j, timeout=30, what="the job held by its pre-flight's accelerators")
    assert held["state"] == "HELD" and held["attempts"] == []
    set_policy(api, "ml", allowed_accelerators=["L4", "T4"], max_gpus_running=1)  # raised again: it runs
    done = wait_state(api, h, held["id"], TERMINAL, timeout=90)
    assert done["state"] == "SUCCEEDED", done
    assert [(a["preflight"], a["accelerator"]) for a in done["attempts"]] == [(True, "T4"), (False, "L4")]


def test_an_allowlist_naming_an_accelerator_no_cloud_offers_is_refused(api, team_headers):
    """`allowed_accelerators: [T4, H10]` was stored: the typo allowed nothing, silently."""
    team_headers("a")
    r = api.put("/v1/teams/a/policy", json={"allowed_accelerators": ["T4", "H10"]}, headers=ADMIN)
    assert r.status_code == 422, r.text
    (err,) = r.json()["errors"]
    assert err["field"] == "allowed_accelerators.1" and "did you mean A10, H100, V100?" in err["message"], err
    assert api.get("/v1/teams/a/policy", headers=ADMIN).json().get("allowed_accelerators") is None  # nothing stored
    set_policy(api, "a", allowed_accelerators=["t4", "A100-80GB"])
