"""A job's metrics, as its trainer reported them (`ckpt.report`): one series
per metric across the job's attempts, scoped to the job's team like the job."""
from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter
from pydantic import BaseModel, Field

from spotbroker.api.deps import CurrentTeam, JobId, SessionDep
from spotbroker.api.errors import Problem, responses
from spotbroker.api.jsonbody import JSONBodyRoute
from spotbroker.broker.jobs import metrics
from spotbroker.broker.usecases import jobs

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], route_class=JSONBodyRoute)


class MetricPointOut(BaseModel):
    step: int
    value: float
    attempt_id: int
    at: datetime = Field(description="when the trainer reported it (the agent's clock)")


class MetricsOut(BaseModel):
    job_id: int
    metrics: dict[str, list[MetricPointOut]] = Field(description=(
        "metric name -> its points by step, across attempts (a step a resumed attempt reported again "
        "appears once per attempt); reports more often than every few seconds are folded"))
    early_stop: dict | None = Field(description="the spec's early_stop rule, if any")


@router.get("/{job_id}/metrics", response_model=MetricsOut, responses=responses(401, 403, 404, 422))
def job_metrics(job_id: JobId, session: SessionDep, team: CurrentTeam) -> MetricsOut:
    """The job's reported metrics, one series per metric."""
    try:
        job = jobs.get(session, team.team_id, job_id)
    except jobs.JobNotFound:
        raise Problem(404, "Not found", f"no job {job_id}") from None
    series = metrics.series(session, job.id)
    return MetricsOut(job_id=job.id, metrics={name: [MetricPointOut(**p) for p in points]
                                              for name, points in series.items()},
                      early_stop=(job.spec or {}).get("early_stop"))
