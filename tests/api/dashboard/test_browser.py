"""The dashboard in a real headless Chromium with every outside host
blocked: logging in through the form, the numbers drawn match the costs
API's, nothing is fetched from anywhere but the broker, a screenshot is
left for a person to look at (the energy and emissions charts among
them), and a job named with a script stays text on
the admin's view."""
from __future__ import annotations

from collections import defaultdict
from datetime import date, timedelta

import pytest
from support.browser import RECTS, Browser, api, chromium, only_local
from support.site import ADMIN, HOSTILE

from spotbroker.api.dashboard.charts import kg, kwh, money

pytestmark = pytest.mark.skipif(chromium() is None, reason=(
    "chromium is not installed (make test installs Debian's chromium via scripts/ensure-chromium as root)"))

def test_a_team_logs_in_and_sees_the_apis_numbers_drawn(site, tmp_path):
    with Browser() as browser:
        browser.goto(f"{site.url}/dashboard")
        assert browser.evaluate("location.pathname") == "/dashboard/login"
        browser.submit("form[action='/dashboard/login']", {"token": site.tokens["ml"]})
        assert browser.evaluate("location.pathname") == "/dashboard/teams/ml"
        (cookie,) = browser.cookies()
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/dashboard"
        assert browser.evaluate("document.cookie") == ""          # no script can read it

        total = api(site, "ml")["total"]
        for dom_id, field in (("total-cost", "cost"), ("total-on-demand", "on_demand_cost"),
                              ("total-savings", "savings"), ("total-wasted", "wasted")):
            assert browser.evaluate(f"document.getElementById('{dom_id}').textContent.trim()") == money(total[field])
        assert total["wasted"] > 0 and total["savings"] > 0 and total["cost"] > 0

        # Per day: the bars of the cloud chart, and of the GPU chart, add up to the API's days.
        by_day = {g["key"]: g["cost"] for g in api(site, "ml", "day")["groups"]}
        for chart in ("cloud-chart", "gpu-chart"):
            drawn = defaultdict(float)
            for day, _, amount in browser.evaluate(RECTS.format(chart=chart)):
                drawn[day] += amount
            assert set(drawn) == {d for d, c in by_day.items() if c > 0}
            for day, cost in by_day.items():
                assert drawn[day] == pytest.approx(cost, abs=1e-4), (chart, day)
        by_cloud = {g["key"]: g["cost"] for g in api(site, "ml", "cloud")["groups"]}
        drawn = defaultdict(float)
        for _, cloud, amount in browser.evaluate(RECTS.format(chart="cloud-chart")):
            drawn[cloud] += amount
        assert dict(drawn) == pytest.approx(by_cloud, abs=1e-4)
        by_job = {f'{g["key"]} {g["name"]}': g["cost"] for g in api(site, "ml", "job")["groups"]}  # (ids: names repeat)
        drawn = {key: amount for _, key, amount in browser.evaluate(RECTS.format(chart="jobs-chart"))}
        assert drawn == pytest.approx(by_job, abs=1e-4)

        # The budget: spent so far this month and the forecast line are there.
        budget = site.client.get("/v1/teams/ml/budget", headers=site.bearer("ml")).json()
        spent = browser.evaluate("document.getElementById('budget-spent').firstChild.textContent.trim()")
        assert spent == money(budget["spent"])
        assert browser.evaluate("document.querySelectorAll('#burn-chart line.forecast').length") == 1
        # The timeline: every attempt of the top jobs, a cross on the reclaimed one.
        assert browser.evaluate("document.querySelectorAll('#timeline-chart rect[data-amount]').length") == 4
        assert browser.evaluate("document.querySelectorAll('#timeline-chart line.reclaim').length") == 2
        assert "5.0 GiB" in browser.evaluate("document.getElementById('storage').textContent")

        # Energy and emissions: the cards and the per-day bars by cloud are the API's kWh and kg CO2e.
        assert browser.evaluate("document.getElementById('total-kwh').textContent.trim()") == kwh(total["kwh"])
        assert browser.evaluate("document.getElementById('total-co2e').firstChild.textContent.trim()") == \
            kg(total["co2e_kg"])
        assert total["kwh"] > 0 and total["co2e_kg"] > 0
        for chart, field in (("energy-chart", "kwh"), ("co2e-chart", "co2e_kg")):
            want = {(day, cloud): 0.0 for day in by_day for cloud in by_cloud}
            for day in by_day:
                since = date.fromisoformat(day)
                since, until = since.isoformat(), (since + timedelta(days=1)).isoformat()
                for g in site.client.get("/v1/teams/ml/costs", params={"group_by": "cloud", "since": since,
                                         "until": until}, headers=site.bearer("ml")).json()["groups"]:
                    want[day, g["key"]] = g[field]
            drawn = {(day, cloud): amount for day, cloud, amount in browser.evaluate(RECTS.format(chart=chart))}
            assert drawn == pytest.approx({k: v for k, v in want.items() if v > 0}, abs=1e-4), chart
            assert browser.evaluate(f"document.querySelectorAll('#{chart} figcaption span').length") == 3
        # A job's page: its kWh and CO2e, and each attempt's grid figure and basis, as GET /v1/jobs/{id}.
        job_id = next(g["key"] for g in api(site, "ml", "job")["groups"] if g["name"] == "pretrain-llama")
        job = site.client.get(f"/v1/jobs/{job_id}", headers=site.bearer("ml")).json()
        browser.goto(f"{site.url}/dashboard/jobs/{job_id}")
        assert browser.evaluate("document.getElementById('job-kwh').textContent.trim()") == kwh(job["energy"]["kwh"])
        assert browser.evaluate("document.getElementById('job-co2e').firstChild.textContent.trim()") == \
            kg(job["energy"]["co2e_kg"])
        rows = browser.evaluate("Array.from(document.querySelectorAll('#energy tr[data-attempt]'))"
                                ".map(r => Array.from(r.cells).map(c => c.textContent.trim()))")
        assert [(r[0], r[4], r[5], r[6].split()[0]) for r in rows] == [
            (str(a["id"]), f"{a['energy']['grid_g_per_kwh']:.0f}", a["energy"]["grid_source"], a["energy"]["basis"])
            for a in job["attempts"]]
        assert [r[6].split()[0] for r in rows] == ["estimated", "measured"]     # aws, then gcp
        job_shot = browser.screenshot(tmp_path / "dashboard-ml-job.png")
        print(f"\nscreenshot of a job's page: {job_shot}")
        browser.goto(f"{site.url}/dashboard/teams/ml")

        only_local(browser)
        shot = browser.screenshot(tmp_path / "dashboard-ml.png")
        print(f"\nscreenshot of team ml's dashboard: {shot}")
        assert shot.stat().st_size > 20_000


def test_a_job_named_with_a_script_is_inert_on_the_admins_view(site, tmp_path):
    with Browser() as browser:
        browser.goto(f"{site.url}/dashboard/login")
        browser.submit("form", {"token": ADMIN["Authorization"].split()[1]})
        assert browser.evaluate("location.pathname") == "/dashboard"
        teams = browser.evaluate("Array.from(document.querySelectorAll('nav.switch a, table.teams a'))"
                                 ".map(a => a.textContent)")
        assert {"ml", "vision"} <= set(teams)
        browser.goto(f"{site.url}/dashboard/teams/ml")
        # The admin switches between teams from every page.
        assert browser.evaluate("Array.from(document.querySelectorAll('nav.switch a')).map(a => a.textContent)") \
            == ["ml", "vision"]
        names = browser.evaluate("Array.from(document.querySelectorAll('td.name')).map(td => td.textContent)")
        assert any(n.split(" ", 1)[1] == HOSTILE for n in names)  # shown as the text it is (after its id)
        assert browser.evaluate("document.querySelectorAll('script, img, iframe, object').length") == 0
        assert browser.evaluate("document.body.dataset.pwned === undefined && document.title !== 'pwned'")
        labels = browser.evaluate("Array.from(document.querySelectorAll('#jobs-chart rect title'))"
                                  ".map(t => t.textContent)")
        assert any(label.split(" ", 1)[1].startswith("<script>") for label in labels)
        only_local(browser)
        shot = browser.screenshot(tmp_path / "dashboard-admin-ml.png")
        print(f"\nscreenshot of the admin's view of team ml: {shot}")
        browser.goto(f"{site.url}/dashboard/teams/vision")
        assert browser.evaluate("document.getElementById('total-cost').textContent.trim()") == \
            money(site.client.get("/v1/teams/vision/costs", headers=ADMIN).json()["total"]["cost"])
