"""The team page lists the team's jobs that do not run, each with why (a
hold, a wait), through the real server; another team's never, and a
reason is shown as text, never as markup."""
from __future__ import annotations

import re

from support.site import HOSTILE
from support.world import World

from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Job, Team


def test_the_team_page_says_why_each_of_its_jobs_does_not_run(site, factory):
    world = World(factory)
    with factory() as s:
        ids = {t.name: t.id for t in s.query(Team)}
    held = world.job(ids["ml"], "held-one", state="HELD")
    waits = world.job(ids["ml"], "waits", state="PENDING")
    theirs = world.job(ids["vision"], "vision-waits", state="PENDING")
    with transaction(factory) as s:
        s.get(Job, held).reason = "held by a limit: team max 8 GPUs at once, 8 running (it needs 1)"
        s.get(Job, waits).reason = "waiting for a local slot: all 4 in use, 2 jobs ahead of it " + HOSTILE
        s.get(Job, theirs).reason = "waiting for spot: plan: wait"
    page = site.client.get("/dashboard/teams/ml", headers=site.bearer("ml"))
    assert page.status_code == 200
    section = re.search(r'<section id="waiting">.*?</section>', page.text, re.S).group(0)
    assert "held by a limit: team max 8 GPUs at once, 8 running (it needs 1)" in section and "HELD" in section
    assert "waiting for a local slot: all 4 in use, 2 jobs ahead of it" in section
    assert "<script>" not in section and "&lt;script&gt;" in section
    assert "vision-waits" not in page.text and "plan: wait" not in page.text
    assert "pretrain-llama" not in section                      # it runs
