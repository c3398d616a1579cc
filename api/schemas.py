"""What the API answers with. Requests are `broker.spec.JobSpec` and the
small models here."""
from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from sqlalchemy.orm import object_session

from spotbroker.broker.energy import usage
from spotbroker.broker.jobs.spec import SpecShapeError, check_shape, labels_of, public
from spotbroker.broker.money import costs
from spotbroker.broker.recovery import earlystop, preflight
from spotbroker.broker.store.models import Attempt, Event, Job
from spotbroker.broker.teampolicy.policy import Policy


def _bounded(value: dict[str, Any]) -> dict[str, Any]:
    try:
        check_shape(value)
    except SpecShapeError as exc:
        raise ValueError(str(exc)) from None
    return value


# Free-form JSON a client stores with us (an agent event's data): no deeper,
# larger or stranger (NUL bytes, non-finite numbers) than a job spec may be.
BoundedData = Annotated[dict[str, Any], AfterValidator(_bounded)]


_INTERVAL = ("the checkpoint interval the library was told, and why: seconds (null: the trainer's own), mode "
             "(auto, code, fixed), and for auto the zone, zone_mtbf_s, reclaims, exposure_s, cost_s (the measured "
             "checkpoint cost C), cost_measured, why (in words), since")


class AttemptEnergy(BaseModel):
    kwh: float = Field(description="energy at the wall so far (PUE included)")
    co2e_kg: float = Field(description="its emissions at the place's grid intensity")
    power_kw: float | None = Field(description="per node, as charged now: the rated estimate or the agent's "
                                   "measured average")
    grid_g_per_kwh: float | None = Field(description="the grid intensity of the attempt's region, fixed at launch")
    grid_source: str | None = Field(description="where that figure comes from (the snapshot's source, or a "
                                    "live reading's zone and hour)")
    basis: str | None = Field(description="estimated (rated power) or measured (the agent's NVML counters)")


class JobEnergy(BaseModel):
    kwh: float
    co2e_kg: float
    kwh_per_1000_steps: float | None = Field(description="per 1,000 of the highest step the trainer reported "
                                             "or checkpointed; null when none")
    kwh_per_epoch: float | None = Field(description="per epoch, when the trainer reported an `epoch` metric")


class AttemptOut(BaseModel):
    id: int
    state: str
    reason: str | None
    cloud: str
    region: str | None
    zone: str | None = Field(description="the cloud's zone name; null when only its id is known")
    zone_id: str | None = Field(description="the zone id (AWS use1-az1) where the catalog gives one")
    instance_type: str | None
    accelerator: str | None
    accelerator_count: float
    use_spot: bool
    num_nodes: int
    price_per_hour: float = Field(description="per node, stored at launch")
    cost: float = Field(description="dollars so far (to now while running)")
    exit_code: int | None
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    preflight: bool = Field(default=False, description="the job's trial run before any GPU was rented")
    checkpoint_interval: dict[str, Any] | None = Field(None, description=_INTERVAL)
    energy: AttemptEnergy | None = None

    @classmethod
    def of(cls, a: Attempt, cost: float, energy: dict | None = None) -> AttemptOut:
        return cls(id=a.id, state=a.state, reason=a.reason, cloud=a.cloud, region=a.region, zone=a.zone,
                   zone_id=a.zone_id, instance_type=a.instance_type, accelerator=a.accelerator,
                   accelerator_count=a.accelerator_count, use_spot=a.use_spot, num_nodes=a.num_nodes,
                   price_per_hour=a.price_per_hour, cost=round(cost, 6),
                   exit_code=a.exit_code, created_at=a.created_at, started_at=a.started_at,
                   ended_at=a.ended_at, preflight=a.preflight, checkpoint_interval=a.checkpoint_interval,
                   energy=energy)


class JobOut(BaseModel):
    id: int
    name: str
    state: str
    reason: str | None
    team: str
    labels: dict[str, str] = Field(description="what its costs are allocated by (resources.labels; with "
                                   "alternatives, those all of them carry)")
    spec: dict[str, Any]
    restarts: int
    recoveries: int
    cost: float
    created_at: datetime
    updated_at: datetime
    ended_at: datetime | None
    attempts: list[AttemptOut]
    preflight: dict[str, Any] | None = Field(default=None, description=(
        "its pre-flight: status (running, passed, failed), seconds, cost, and the GPU place it stood in for "
        "(gpu_place, gpu_price_per_hour, num_nodes) with gpu_would_have_cost; when failed, why and the "
        "output's last lines (tail)"))
    early_stop: dict[str, Any] | None = Field(None, description=(
        "once the spec's early_stop rule fired: metric, best_step, best_value, stopped_step, the checkpoint "
        "kept (id, step, uri, choice: best | after_best), hours_run, dollars_run, and with estimated_hours "
        "hours_saved and dollars_saved (else null, and `saving` says why)"))
    checkpoint_interval: dict[str, Any] | None = Field(None, description="the newest attempt's: " + _INTERVAL)
    energy: JobEnergy | None = Field(None, description="kWh and kg CO2e so far (as its cost), and per 1,000 "
                                     "steps and per epoch where the trainer's reports tell")

    @classmethod
    def of(cls, job: Job, team: str, now: datetime) -> JobOut:
        ledger = costs.job_money(job, now)  # from the ledger (broker/money/)
        money = {i: m.cost for i, m in ledger.items()}
        attempts = [AttemptOut.of(a, money.get(a.id, 0.0), usage.attempt_energy(a, ledger.get(a.id)))
                    for a in job.attempts]
        stopped = earlystop.summary(object_session(job), job, sum(money.values()), now)
        return cls(id=job.id, name=job.name, state=job.state, reason=job.reason, team=team,
                   labels=labels_of(job.spec), spec=public(job.spec), restarts=job.restarts, recoveries=job.recoveries,
                   cost=round(sum(money.values()), 6), created_at=job.created_at,
                   updated_at=job.updated_at, ended_at=job.ended_at, attempts=attempts,
                   preflight=preflight.of_job(job), early_stop=stopped,
                   energy=usage.job_energy(object_session(job), job.id, ledger),
                   checkpoint_interval=next((a.checkpoint_interval for a in reversed(attempts)
                                             if a.checkpoint_interval), None))


class SubmitWarning(BaseModel):
    field: str
    message: str
    line: int | None = Field(default=None, description="in the submitted task file")


class JobSubmitted(JobOut):
    """The job just submitted, and what of the submission was dropped (an
    alternative on a cloud the broker does not place on)."""

    warnings: list[SubmitWarning] = Field(default_factory=list)


class JobPage(BaseModel):
    jobs: list[JobOut]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null at the end")


class EventOut(BaseModel):
    id: int
    type: str
    at: datetime
    attempt_id: int | None
    data: dict[str, Any]

    @classmethod
    def of(cls, e: Event) -> EventOut:
        return cls(id=e.id, type=e.type, at=e.at, attempt_id=e.attempt_id, data=e.data or {})


class EventList(BaseModel):
    events: list[EventOut]
    next_after: int | None = Field(None, description="pass as ?after= for the next page; null at the end")


class TeamCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$",
                      description="lower-case letters, digits, '-' and '_'")


class TeamOut(BaseModel):
    id: int
    name: str
    created_at: datetime


class TokenOut(BaseModel):
    team: str
    token: str = Field(description="shown once; only its SHA-256 digest is stored")


class TokensRevoked(BaseModel):
    team: str
    revoked: int = Field(description="how many working tokens were revoked")


class PolicyOut(Policy):
    """A team's policy as stored (keys not set are left out)."""

    team: str


class LaunchReadiness(BaseModel):
    launcher: str
    ready: bool
    detail: str


class Health(BaseModel):
    status: str
    detail: str | None = None
    launch: LaunchReadiness | None = None  # /readyz with a cloud launcher: whether it can launch now


class CheckpointOut(BaseModel):
    id: int
    attempt_id: int
    step: int
    uri: str
    bytes: int
    seconds: float | None
    reason: str | None
    keep: bool = Field(description="never deleted or archived")
    committed_at: datetime


class CheckpointList(BaseModel):
    checkpoints: list[CheckpointOut]
    next_cursor: str | None = Field(None, description="the next page's cursor; null on the last page")
