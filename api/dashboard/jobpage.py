"""The dashboard's job page: its energy and emissions (each attempt's grid
figure, measured or estimated), a curve per metric the trainer reported, and
what its early stop did and saved. A team reads its own jobs only; the admin
any team's."""
from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from spotbroker.api.dashboard.curves import curve
from spotbroker.api.dashboard.routes import Viewer, page, router, to_login
from spotbroker.broker.energy import usage
from spotbroker.broker.jobs import metrics
from spotbroker.broker.money import costs
from spotbroker.broker.recovery import earlystop
from spotbroker.broker.store.models import Job, Team


@router.get("/jobs/{job_id}")
def job(request: Request, job_id: str, principal: Viewer) -> Response:
    if principal is None:
        return to_login()
    now = request.app.state.clock.now()
    # An id is ASCII digits: int() also reads `1_0` (job 10), `+10` and other scripts' digits.
    number = int(job_id) if job_id.isascii() and job_id.isdigit() else 0
    with request.app.state.session_factory() as s:
        found = s.get(Job, number) if 0 < number < 2**63 else None
        team = s.get(Team, found.team_id) if found is not None else None
        if found is None or (not principal.is_admin and principal.team_name != team.name):
            return page("error.html", 404, title="Not found", detail=f"no job {job_id}", admin=principal.is_admin)
        ledger = costs.job_money(found, now, s)
        dollars = sum(m.cost for m in ledger.values())
        energy = usage.job_energy(s, found.id, ledger)
        places = [(a, usage.attempt_energy(a, ledger.get(a.id))) for a in found.attempts if a.started_at is not None]
        stop = earlystop.summary(s, found, dollars, now)
        rule = (found.spec or {}).get("early_stop") or {}
        charts = []
        for name, points in metrics.series(s, found.id).items():
            line = sorted({p["step"]: p["value"] for p in points}.items())  # a step reported again: the newest
            mine = stop if stop is not None and name == rule.get("metric") else None
            charts.append((name, curve(line, mine["best_step"] if mine else None,
                                       mine["stopped_step"] if mine else None)))
        return page("job.html", job=found, team=team.name, stop=stop, rule=rule, charts=charts, dollars=dollars,
                    energy=energy, places=places,
                    now=now, admin=principal.is_admin)
