"""The whole OpenAPI document, fuzzed by schemathesis, as a team and as the
admin: no 5xx, every status the document lists, every body the shape it
says. Against a server whose launchers run nothing (the local launcher off,
no reconciler), so a generated `run` string never executes; the log route
is fuzzed without `follow` (a stream is not one answer). Bounded by a
number of cases (EXAMPLES per operation and mode), never by seconds: how
long that takes depends on the machine's load, not on the broker."""
from __future__ import annotations

import time

import pytest
import schemathesis
from conftest import ADMIN_TOKEN, served
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]
EXAMPLES = 12    # per operation and generation mode: what keeps the run short


def without_follow(document: dict) -> dict:
    logs = document["paths"]["/v1/jobs/{job_id}/logs"]["get"]
    logs["parameters"] = [p for p in logs["parameters"] if p["name"] != "follow"]
    return document


@pytest.fixture
def quiet_server(settings):
    settings.local_launcher = False
    with served(settings, run_reconciler=False) as client:
        yield client


@pytest.mark.parametrize("who", ["team", "admin"])
def test_the_openapi_document_holds_under_fuzzing(quiet_server, who):
    api = quiet_server
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    if who == "team":
        token = api.post("/v1/teams", json={"name": "fuzz"}, headers=admin).json()["token"]
        auth = {"Authorization": f"Bearer {token}"}
        api.post("/v1/jobs", json={"name": "seen", "run": "true"}, headers=auth)  # something to find
    else:
        auth = admin
    schema = schemathesis.openapi.from_dict(without_follow(api.get("/openapi.json").json()))
    base_url = str(api.base_url).rstrip("/")
    started, failures, tried = time.monotonic(), [], 0
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))
            def run(case):
                case.call_and_validate(base_url=base_url, headers=auth, checks=CHECKS, timeout=30)

            try:
                run()
            except Unsatisfiable:  # nothing to get wrong in a call without parameters
                pass
            except Exception as exc:  # collect them all, then fail with every one
                # A flaky failure holds the first call's error among its sub-exceptions: say it.
                causes = "".join(f"\n  {type(e).__name__}: {e}" for e in getattr(exc, "exceptions", ()))
                failures.append(f"{operation.label} ({mode.value}): {exc}{causes}")
            tried += 1
    took = time.monotonic() - started
    assert tried >= 30
    assert not failures, "\n\n".join(failures)
    print(f"{who}: {tried} operation-modes in {took:.1f} s")
