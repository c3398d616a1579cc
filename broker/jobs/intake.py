"""What a submission meets before it is written: the team's policy (its
defaults merged in, its limits checked) and whether the job will be HELD
at once (over budget, or over the team's GPUs at once), so the answer says
so instead of a PENDING that turns HELD later."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker.jobs import limits
from spotbroker.broker.jobs import policy as policies
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.money import budgets


def policy_of(factory: sessionmaker[Session], team_id: int) -> policies.Policy:
    with factory() as session:
        return policies.get(session, team_id)


def with_defaults(doc: Any, policy: policies.Policy) -> Any:
    return policies.with_defaults(doc, policy, frozenset(JobSpec.model_fields))


@dataclass(frozen=True)
class Admission:
    errors: list[dict[str, str]]  # the limits the job breaks (a 422)
    hold: str | None              # why it will be HELD at once, if it will


def admit(factory: sessionmaker[Session], team_id: int, team: str, spec: JobSpec, policy: policies.Policy,
          cpu_jobs_on_host: bool, now: datetime) -> Admission:
    with factory() as session:
        errors = limits.submit_errors(session, spec, team, policy, cpu_jobs_on_host)
        if errors:
            return Admission(errors, None)
        hold = (budgets.hold_reason(session, team_id, False, now)
                or limits.gpus_hold(session, team_id, spec, policy))
        return Admission([], hold)
