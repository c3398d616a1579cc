"""What a submission meets before it is written: the team's policy (its
defaults merged in, its limits checked) and whether the job will be HELD
at once (over budget, or over the team's GPUs at once), so the answer says
so instead of a PENDING that turns HELD later."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.jobs.states import LIVE_JOB_STATES
from spotbroker.broker.money import budgets
from spotbroker.broker.store.models import Job
from spotbroker.broker.teampolicy import limits
from spotbroker.broker.teampolicy import policy as policies


@dataclass(frozen=True)
class Team:
    """What a submission needs of its team before its spec is read (one short
    session: submission is the API's hot path)."""

    policy: policies.Policy
    budget_hold: str | None  # over budget: the job is HELD from the start
    full: str | None         # the team has as many unfinished jobs as it may: the submission is refused
    keyed: Keyed | None = None  # the job the request's Idempotency-Key already made, if any


@dataclass(frozen=True)
class Keyed:
    job_id: int
    digest: str | None  # its request's sha256 (None: made before digests were kept)


def team_of(factory: sessionmaker[Session], team_id: int, now: datetime, max_unfinished: int = 0,
            idempotency_key: str | None = None) -> Team:
    with factory() as session:
        keyed = None
        if idempotency_key is not None:
            row = session.execute(select(Job.id, Job.idempotency_digest).where(
                Job.team_id == team_id, Job.idempotency_key == idempotency_key)).first()
            keyed = Keyed(row.id, row.idempotency_digest) if row is not None else None
        full = None if keyed is not None else _full(session, team_id, max_unfinished)
        return Team(policies.get(session, team_id), budgets.hold_reason(session, team_id, False, now), full, keyed)


# Built once (a submission is the API's hot path); the index on (team_id, state) answers it,
# and the count stops at the bound (a team with thousands waiting cost a count of all of them,
# at each submission: PostgreSQL's submissions per second fell from 400 to under 300).
_UNFINISHED = select(func.count()).select_from(
    select(Job.id).where(Job.team_id == bindparam("team"), Job.state.in_([str(s) for s in LIVE_JOB_STATES]))
    .limit(bindparam("bound")).subquery())


def _full(session: Session, team_id: int, max_unfinished: int) -> str | None:
    """Why the team may submit no more jobs now, if it may not."""
    if not max_unfinished:
        return None
    count = session.scalar(_UNFINISHED, {"team": team_id, "bound": max_unfinished})
    if count < max_unfinished:
        return None
    return (f"the team has {count} unfinished job{'' if count == 1 else 's'}, as many as a team may have at once "
            f"(SPOTBROKER_MAX_UNFINISHED_JOBS_PER_TEAM={max_unfinished}): submit again once some have ended, "
            "or cancel some")


def with_defaults(doc: Any, policy: policies.Policy) -> Any:
    return policies.with_defaults(doc, policy, frozenset(JobSpec.model_fields))


@dataclass(frozen=True)
class Admission:
    errors: list[dict[str, str]]  # the limits the job breaks (a 422)
    hold: str | None              # why it will be HELD at once, if it will


def without_policy(team: Team) -> Admission | None:
    """The admission of a team with no policy (no limit to check: no session), else None."""
    return Admission([], team.budget_hold) if team.policy is policies.EMPTY else None


def admit(factory: sessionmaker[Session], team_id: int, name: str, spec: JobSpec, team: Team,
          cpu_jobs_on_host: bool) -> Admission:
    """The limits the job breaks, and why it will be HELD."""
    with factory() as session:
        errors = limits.submit_errors(session, spec, name, team.policy, cpu_jobs_on_host)
        if errors:
            return Admission(errors, None)
        return Admission([], team.budget_hold or limits.gpus_holds(session, team_id, spec, team.policy,
                                                                   spec.preflight is not None))
