"""What a submission meets before it is written: the team's policy (its
defaults merged in, its limits checked) and whether the job will be HELD
at once (over budget, or over the team's GPUs at once), so the answer says
so instead of a PENDING that turns HELD later."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.money import budgets
from spotbroker.broker.teampolicy import limits
from spotbroker.broker.teampolicy import policy as policies


@dataclass(frozen=True)
class Team:
    """What a submission needs of its team before its spec is read (one short
    session: submission is the API's hot path)."""

    policy: policies.Policy
    budget_hold: str | None  # over budget: the job is HELD from the start


def team_of(factory: sessionmaker[Session], team_id: int, now: datetime) -> Team:
    with factory() as session:
        return Team(policies.get(session, team_id), budgets.hold_reason(session, team_id, False, now))


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
