"""The team page's open alerts, through the real server: their figures are
read when the page is, and they send the reader to the job that spends or
to the budget, not to a command line (the CLI and the webhooks give those)."""
from __future__ import annotations

import re

from sqlalchemy import select
from support.site import ADMIN

from spotbroker.broker.money import alerts
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Job
from spotbroker.broker.store.moneymodels import Alert


def test_open_alerts_on_the_page_are_live_and_link_to_the_job_or_the_budget(site, factory):
    r = site.client.put("/v1/teams/ml/budget", headers=ADMIN, json={
        "amount": 20000, "period": "month", "rules": {"thresholds": [5], "fast_burn": False, "slow_burn": False}})
    assert r.status_code == 200, r.text
    with transaction(factory) as s:
        alerts.evaluate(s, site.clock.now())
    site.clock.advance(hours=2)
    with factory() as s:
        fired = {a.rule: a.summary for a in s.scalars(select(Alert).where(Alert.open_key.is_not(None)))}
        finetune = s.scalar(select(Job.id).where(Job.name == "finetune-h100"))
    assert set(fired) == {"forecast", "spend_5"}
    page = site.client.get("/dashboard/teams/ml", headers=site.bearer("ml"))
    assert page.status_code == 200
    section = re.search(r'<section class="alerts".*?</section>', page.text, re.S).group(0)
    forecast = re.search(r'<p class="alert warning" data-alert="\d+"><strong>forecast</strong>(.*?)</p>', section,
                         re.S).group(1)
    assert fired["forecast"] not in forecast                       # two hours on: $80 more spent
    assert "running jobs cost $40.00/h" in forecast
    assert f'<a href="#job-{finetune}">job finetune-h100 ($40.00/h)</a>' in forecast
    assert '<a href="#budget">the budget</a>' in section
    assert "spotbroker " not in section and "`" not in section     # no command for a reader of the page
    assert f'id="job-{finetune}"' in page.text and 'id="budget"' in page.text
