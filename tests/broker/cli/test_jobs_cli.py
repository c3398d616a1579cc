"""`spotbroker jobs` and `spotbroker cancel`, run as a user runs them against a
real server: what a script acting on every job, or cancelling one, reads."""
from __future__ import annotations

import json

from conftest import ADMIN_TOKEN
from sqlalchemy import select
from support.cli import spotbroker
from support.helpers import team_token
from support.world import World

from spotbroker.broker.store.models import Team


def test_cancel_of_a_job_that_had_ended_says_nothing_was_cancelled(api, env, factory):
    """It printed `job 1: SUCCEEDED` and exit 0, as if cancelled just then."""
    token = team_token(api, "ml", ADMIN_TOKEN)
    with factory() as s:
        ml = s.scalar(select(Team.id).where(Team.name == "ml"))
    job = World(factory).job(ml, name="done", state="SUCCEEDED")
    r = spotbroker("cancel", str(job), env={**env, "SPOTBROKER_TOKEN": token})
    said = r.stdout.strip()
    assert r.returncode == 0 and said == f"job {job}: SUCCEEDED: it had already ended, nothing was cancelled"


def test_jobs_all_follows_every_page(api, env, factory):
    """A bot acting on `spotbroker jobs --json` saw the first page only, and nothing said more existed."""
    token = team_token(api, "ml", ADMIN_TOKEN)
    with factory() as s:
        ml = s.scalar(select(Team.id).where(Team.name == "ml"))
    made = [World(factory).job(ml, name=f"j{i}", state="SUCCEEDED") for i in range(3)]
    mine = {**env, "SPOTBROKER_TOKEN": token}
    r = spotbroker("jobs", "--limit", "2", "--all", "--json", env=mine)
    assert r.returncode == 0 and [j["id"] for j in json.loads(r.stdout)["jobs"]] == made[::-1], r.stderr
    r = spotbroker("jobs", "--limit", "2", env=mine)
    assert r.returncode == 0 and "(the newest 2: --all lists every page)" in r.stderr, r.stderr
