"""What the API's money routes do, as plain functions taking a session.
Who may see a team's money is the router's to decide; here a team is found
by name or is not found."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from spotbroker.broker.models import Team
from spotbroker.broker.money import views


class TeamNotFound(LookupError):
    pass


def team_id(session: Session, name: str) -> int:
    found = session.scalar(select(Team.id).where(Team.name == name))
    if found is None:
        raise TeamNotFound(f"no team {name!r}")
    return found


def costs(session: Session, name: str, since: datetime, until: datetime, group_by: str | None,
          now: datetime) -> views.Report:
    """A team's spend with entries starting in [since, until), grouped."""
    return views.team_costs(session, team_id(session, name), since, until, group_by, now)
