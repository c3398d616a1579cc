"""The admin's overview and a team's chart by label, in a real headless
Chromium: each team's row shows its spend, its budget and what it spent of
it this period, its open alerts and its spend per day, as the API answers
them; a team's page charts its spend per day by the value of a chosen
label, summing to the costs API's `group_by=label:KEY`, and a label's
value that is a script stays text. Screenshots are left for a person."""
from __future__ import annotations

from collections import defaultdict

import pytest
from sqlalchemy import func, select
from support.browser import RECTS, Browser, api, chromium, only_local
from support.site import ADMIN, HOSTILE_LABEL

from spotbroker.api.dashboard.charts import money
from spotbroker.broker.money import alerts
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Team
from spotbroker.broker.store.moneymodels import Alert

pytestmark = pytest.mark.skipif(chromium() is None, reason=(
    "chromium is not installed (make test installs Debian's chromium via scripts/ensure-chromium as root)"))

ROW = "document.querySelector('tr[data-team=\"{team}\"] td.{cell}').textContent.trim()"


def test_the_admins_overview_shows_budget_spend_alerts_and_trend_per_team(site, factory, tmp_path):
    r = site.client.put("/v1/teams/vision/budget", json={"amount": 5, "period": "month"}, headers=ADMIN)
    assert r.status_code == 200, r.text
    with transaction(factory) as s:
        alerts.evaluate(s, site.clock.now())
    with factory() as s:
        open_alerts = dict(s.execute(select(Team.name, func.count()).join(Alert, Alert.team_id == Team.id)
                                     .where(Alert.open_key.is_not(None)).group_by(Team.name)).all())
    assert open_alerts.get("vision", 0) >= 1 and open_alerts.get("ml", 0) >= 1    # over budget; the forecast
    with Browser() as browser:
        browser.goto(f"{site.url}/dashboard/login")
        browser.submit("form", {"token": ADMIN["Authorization"].split()[1]})
        assert browser.evaluate("location.pathname") == "/dashboard"
        rows = browser.evaluate("Array.from(document.querySelectorAll('table.teams tbody tr'))"
                                ".map(tr => tr.dataset.team)")
        assert rows == ["ml", "vision"]                                  # most spent first
        for team in rows:
            costs = api(site, team)
            assert browser.evaluate(ROW.format(team=team, cell="total")) == money(costs["total"]["cost"])
            budget = site.client.get(f"/v1/teams/{team}/budget", headers=ADMIN).json()
            assert browser.evaluate(ROW.format(team=team, cell="budget")) == f"{money(budget['amount'])} a month"
            spent = browser.evaluate(ROW.format(team=team, cell="spent"))
            assert spent.startswith(money(budget["spent"])), spent
            meter = {key: amount for _, key, amount in browser.evaluate(RECTS.format(chart=f"meter-{team}"))}
            assert meter == pytest.approx({"budget": budget["amount"], "spent": budget["spent"]}, abs=1e-4)
            assert browser.evaluate(ROW.format(team=team, cell="alerts-open")) == str(open_alerts[team])
            # The trend: a bar per day of the last 30 (whole UTC days, today's to now), each the API's spend.
            drawn = {day: amount for day, _, amount in browser.evaluate(RECTS.format(chart=f"trend-{team}"))}
            assert sorted(drawn)[0] == "2026-02-01" and sorted(drawn)[-1] == "2026-03-02" and len(drawn) == 30
            r = site.client.get(f"/v1/teams/{team}/costs", params={"group_by": "day", "since": "2026-02-01T00:00Z"},
                                headers=ADMIN)
            by_day = {g["key"]: g["cost"] for g in r.json()["groups"]}
            assert {d: a for d, a in drawn.items() if a} == pytest.approx(
                {d: c for d, c in by_day.items() if c}, abs=1e-4)
        # vision spent past its budget: its meter is full and red.
        assert budget["spent"] > budget["amount"]
        assert browser.evaluate("document.querySelector('#meter-vision rect[data-key=spent]').getAttribute('fill')") \
            == "#D55E00"
        # A range shorter than the budget's period: what was spent this period still counts it all.
        browser.goto(f"{site.url}/dashboard?days=1")
        for team in ("ml", "vision"):
            spent = site.client.get(f"/v1/teams/{team}/budget", headers=ADMIN).json()["spent"]
            assert browser.evaluate(ROW.format(team=team, cell="spent")).startswith(money(spent))
            assert browser.evaluate(ROW.format(team=team, cell="total")) == money(
                site.client.get(f"/v1/teams/{team}/costs", params={"since": "2026-03-01T12:00:00Z"},
                                headers=ADMIN).json()["total"]["cost"])
        browser.goto(f"{site.url}/dashboard")
        only_local(browser)
        shot = browser.screenshot(tmp_path / "dashboard-overview.png")
        print(f"\nscreenshot of the admin's overview: {shot}")
        assert shot.stat().st_size > 20_000


def test_a_teams_page_charts_its_spend_by_a_chosen_label(site, tmp_path):
    with Browser() as browser:
        browser.goto(f"{site.url}/dashboard/login")
        browser.submit("form", {"token": site.tokens["ml"]})
        browser.goto(f"{site.url}/dashboard/teams/ml?label=project")
        keys = browser.evaluate("Array.from(document.querySelectorAll('nav[aria-label=labels] a'))"
                                ".map(a => [a.textContent, a.hasAttribute('aria-current')])")
        assert keys == [["owner", False], ["project", True]]             # only ml's labels
        drawn = defaultdict(float)
        for _, value, amount in browser.evaluate(RECTS.format(chart="label-chart")):
            drawn[value] += amount
        by_label = {g["key"]: g["cost"] for g in api(site, "ml", "label:project")["groups"]}
        assert set(by_label) == {"llama", HOSTILE_LABEL}
        assert dict(drawn) == pytest.approx({k: v for k, v in by_label.items() if v}, abs=1e-4)
        legend = browser.evaluate("Array.from(document.querySelectorAll('#label-chart .legend span'))"
                                  ".map(s => s.textContent)")
        assert HOSTILE_LABEL in legend and "vision-secret" not in browser.evaluate("document.body.innerHTML")
        assert browser.evaluate("document.querySelectorAll('script, img, iframe, object').length") == 0
        assert browser.evaluate("document.body.dataset.pwned === undefined")
        only_local(browser)
        shot = browser.screenshot(tmp_path / "dashboard-label.png")
        print(f"\nscreenshot of team ml's spend by label: {shot}")
        assert shot.stat().st_size > 20_000
        # By another label: jobs without it are "(none)"; a bad label's name is refused.
        browser.goto(f"{site.url}/dashboard/teams/ml?label=owner")
        drawn = defaultdict(float)
        for _, value, amount in browser.evaluate(RECTS.format(chart="label-chart")):
            drawn[value] += amount
        assert dict(drawn) == pytest.approx({g["key"]: g["cost"] for g in api(site, "ml", "label:owner")["groups"]
                                             if g["cost"]}, abs=1e-4)
        assert set(drawn) == {"ann", "(none)"}
    r = site.client.get("/dashboard/teams/ml", params={"label": "bad key"}, headers=site.bearer("ml"))
    assert r.status_code == 422 and "label" in r.text
