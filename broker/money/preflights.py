"""A team's pre-flights, as its dashboard page shows them: each one's
outcome and cost, what the GPU launch a failed one stood in for would have
cost by the time it failed (the GPU place's price x that time x nodes), and
the totals. Read from the pre-flight events (broker/recovery/preflight.py),
which hold those figures as they were at the pre-flight's end."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from spotbroker.broker import auth
from spotbroker.broker.jobs.preflight import FAILED, PASSED
from spotbroker.broker.store.models import Event, Job

SHOWN = 20


@dataclass(frozen=True)
class PreflightLine:
    job_id: int
    job: str
    at: datetime
    passed: bool
    seconds: float
    cost: float
    gpu: str
    would_have_cost: float
    why: str


@dataclass
class TeamPreflights:
    lines: list[PreflightLine] = field(default_factory=list)  # the newest SHOWN
    passed: int = 0
    failed: int = 0
    cost: float = 0.0             # what every pre-flight in the range cost
    gpu_not_spent: float = 0.0    # what the failed ones' GPU launches would have cost by their failure


def team_preflights(session: Session, name: str, since: datetime) -> TeamPreflights:
    """The team's pre-flights that ended since `since`, newest first (raises auth.TeamNotFound)."""
    team_id = auth.team_id(session, name)
    out = TeamPreflights()
    rows = session.execute(
        select(Event.type, Event.at, Event.data, Job.id, Job.name).join(Job, Job.id == Event.job_id)
        .where(Job.team_id == team_id, Event.type.in_((PASSED, FAILED)), Event.at >= since)
        .order_by(Event.at.desc(), Event.id.desc()))
    for kind, at, data, job_id, job_name in rows:
        data: dict[str, Any] = data or {}
        passed = kind == PASSED
        out.passed, out.failed = out.passed + passed, out.failed + (not passed)
        out.cost += float(data.get("cost") or 0.0)
        would = float(data.get("gpu_would_have_cost") or 0.0)
        if not passed:
            out.gpu_not_spent += would
        if len(out.lines) < SHOWN:
            gpu = f"{data.get('gpu_instance_type') or '-'} x {data.get('num_nodes', 1)}"
            out.lines.append(PreflightLine(job_id=job_id, job=job_name, at=at, passed=passed,
                                           seconds=float(data.get("seconds") or 0.0),
                                           cost=float(data.get("cost") or 0.0), gpu=gpu, would_have_cost=would,
                                           why=str(data.get("why") or "")))
    return out
