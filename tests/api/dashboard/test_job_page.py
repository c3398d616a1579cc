"""The dashboard's job page through the real server: a curve per reported
metric with the best and stopped steps marked, and what the early stop
saved; a team sees its own jobs only."""
from __future__ import annotations

import re
from datetime import timedelta

from sqlalchemy import select, update
from support.site import ADMIN
from support.world import T0, World

from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.metricmodels import EarlyStop, MetricPoint
from spotbroker.broker.store.models import Checkpoint, Job, Team

RULE = {"metric": "val_loss", "mode": "min", "patience": 3, "min_delta": 0.001, "min_steps": 0}
H = timedelta(hours=1)


def stopped_job(factory) -> int:
    world = World(factory)
    with factory() as s:
        ml = s.scalar(select(Team.id).where(Team.name == "ml"))
    job = world.job(ml, "plateau", state="SUCCEEDED")
    attempt = world.attempt(job, start=T0 - 2 * H, end=T0 - 1 * H, price=2.0)
    with transaction(factory) as s:
        s.execute(update(Job).where(Job.id == job).values(
            spec={"name": "plateau", "run": "true", "early_stop": RULE, "estimated_hours": 10},
            reason="early_stopped"))
        for i, loss in enumerate([3.0, 2.0, 1.5, 1.49, 1.6, 1.7, 1.8]):
            s.add(MetricPoint(job_id=job, attempt_id=attempt, step=100 * (i + 1), name="val_loss", value=loss,
                              at=T0 - 2 * H + i * timedelta(minutes=5)))
        kept = Checkpoint(job_id=job, attempt_id=attempt, step=300, uri="file:///ckpt/ml/1/1/step-000000000300",
                          bytes=10, reason="best", keep=True, committed_at=T0 - H)
        s.add(kept)
        s.flush()
        s.add(EarlyStop(job_id=job, attempt_id=attempt, metric="val_loss", decided_at=T0 - H, step=700,
                        best_step=300, best_value=1.5, finished_at=T0 - H, stopped_step=700,
                        checkpoint_id=kept.id, checkpoint_choice="best"))
    return job


def test_the_job_page_draws_each_metric_and_says_what_the_early_stop_saved(site, factory):
    job = stopped_job(factory)
    page = site.client.get(f"/dashboard/jobs/{job}", headers=site.bearer("ml"))
    assert page.status_code == 200, page.text
    figure = re.search(r'<figure class="chart" id="metric-1">.*?</figure>', page.text, re.S).group(0)
    assert figure.count('class="metric"') == 6  # seven points, six segments
    assert 'class="best"' in figure and ">best 300<" in figure and ">stopped 700<" in figure
    saved = re.search(r'id="early-stop-saved"[^>]*>(.*?)</dd>', page.text, re.S).group(1)
    assert "9.00 h" in saved and "$18.00" in saved  # 10 h estimated, 1 h run, at $2/h
    assert "step-000000000300" in page.text and "saved at the best report" in page.text
    team = site.client.get("/dashboard/teams/ml", headers=site.bearer("ml")).text
    assert f'href="/dashboard/jobs/{job}"' in team

    assert site.client.get(f"/dashboard/jobs/{job}", headers=site.bearer("vision")).status_code == 404
    assert site.client.get(f"/dashboard/jobs/{job}", headers=ADMIN).status_code == 200
    assert site.client.get("/dashboard/jobs/999999", headers=site.bearer("ml")).status_code == 404
    # An id is ASCII digits: `1_0` is not job 10, nor `+1` job 1.
    odd = [f"{str(job)[:1]}_{str(job)[1:]}" if job > 9 else f"0_{job}", f"+{job}", f"%20{job}", "abc", "1e3"]
    for spelled in odd:
        answer = site.client.get(f"/dashboard/jobs/{spelled}", headers=site.bearer("ml"))
        assert answer.status_code == 404 and "<html" in answer.text.lower(), (spelled, answer.status_code)
    assert site.client.get(f"/dashboard/jobs/{job}", follow_redirects=False).status_code == 303  # log in first


def test_a_flat_metric_at_any_magnitude_still_draws(site, factory):
    """A trainer's own numbers must not break its page: a flat line at 1e17
    (its padding once rounded away, dividing by zero) and a span near the
    float's limits."""
    world = World(factory)
    with factory() as s:
        ml = s.scalar(select(Team.id).where(Team.name == "ml"))
    job = world.job(ml, "huge", state="SUCCEEDED")
    attempt = world.attempt(job, start=T0 - 2 * H, end=T0 - 1 * H)
    with transaction(factory) as s:
        for name, values in (("flat", [1e17, 1e17]), ("wide", [-1.7e308, 1.7e308])):
            for i, value in enumerate(values):
                s.add(MetricPoint(job_id=job, attempt_id=attempt, step=i + 1, name=name, value=value,
                                  at=T0 - 2 * H + i * timedelta(minutes=5)))
    page = site.client.get(f"/dashboard/jobs/{job}", headers=site.bearer("ml"))
    assert page.status_code == 200, page.text
    assert ">nan<" not in page.text.lower() and "\"nan\"" not in page.text.lower()
