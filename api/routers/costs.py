"""A team's costs, from the ledger: totals (paid, on-demand equivalent,
savings, waste, and the energy and emissions beside them) over a time
range, optionally grouped by day, job, cloud, GPU, zone or a label of the
jobs (`label:KEY`), as JSON or as CSV (`costs.csv`). A team's token reads
its own team; the admin's, any team's. The ledger is written in the
background (broker/background.py)."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import BaseModel, Field

from spotbroker.api.deps import Caller, SessionDep
from spotbroker.api.errors import Problem, invalid, responses
from spotbroker.api.jsonbody import JSONBodyRoute
from spotbroker.broker import auth
from spotbroker.broker.auth import Principal
from spotbroker.broker.jobs import resfields
from spotbroker.broker.money import export, views
from spotbroker.broker.usecases import money as money_cases

MAX_DAYS = 400


router = APIRouter(prefix="/v1", tags=["costs"], route_class=JSONBodyRoute)

TeamName = Annotated[str, Path(pattern=auth.TEAM_NAME_RE.pattern, description="the team's name")]
When = Annotated[datetime | None, Query(description="ISO 8601; without a zone, UTC")]


class Money(BaseModel):
    cost: float = Field(description="dollars paid")
    on_demand_cost: float = Field(description="the same node-hours at the on-demand price")
    savings: float = Field(description="on_demand_cost - cost")
    wasted: float = Field(description="dollars of work lost to reclaims (since the last checkpoint)")
    node_hours: float
    kwh: float = Field(description="energy at the wall (PUE included), measured or estimated per attempt")
    co2e_kg: float = Field(description="its emissions at each place's grid intensity (kg CO2e)")

    @classmethod
    def of(cls, m: views.Money) -> Money:
        return cls(cost=round(m.cost, 6), on_demand_cost=round(m.on_demand_cost, 6), savings=round(m.savings, 6),
                   wasted=round(m.wasted, 6), node_hours=round(m.node_hours, 6), kwh=round(m.kwh, 6),
                   co2e_kg=round(m.co2e_kg, 6))


class CostGroup(Money):
    key: str = Field(description="the day (YYYY-MM-DD, UTC), job id, cloud, GPU ('none': CPU), "
                                 "cloud/region/zone, or the label's value ('(none)': jobs without it)")
    name: str | None = Field(None, description="the job's name, grouping by job")


class CostReport(BaseModel):
    team: str
    since: datetime
    until: datetime
    group_by: str | None
    currency: str = "USD"
    total: Money
    groups: list[CostGroup]


def may_read(principal: Principal, name: str) -> None:
    """The admin reads every team; a team only itself (another team's name,
    whether it exists or not, is refused alike)."""
    if not principal.is_admin and principal.team_name != name:
        raise Problem(403, "Forbidden", "a team's token reads its own team only")


def time_range(since: datetime | None, until: datetime | None, now: datetime) -> tuple[datetime, datetime]:
    def utc(field: str, value: datetime) -> datetime:
        try:
            value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        except OverflowError:  # year 1 or 9999 with an offset that takes it past the calendar's ends
            value = datetime.min.replace(tzinfo=UTC)
        if not 2000 <= value.year <= 2999:
            raise invalid([{"field": field, "message": "a time between the years 2000 and 2999"}])
        return value

    given_until = until is not None
    until = utc("until", until) if given_until else now
    since = utc("since", since) if since is not None else until - timedelta(days=30)
    if since >= until:  # (blamed on until only when it was given: "until defaults to now" otherwise)
        raise invalid([{"field": "until", "message": "must be after since"}] if given_until else
                      [{"field": "since", "message": "is not before now (until, not given, is now)"}])
    if until - since > timedelta(days=MAX_DAYS):
        raise invalid([{"field": "since", "message": f"a range of at most {MAX_DAYS} days"}])
    return since, until


GroupBy = Annotated[str | None, Query(max_length=140, description=(
    "day, job, cloud, gpu, zone, or label:KEY (by the value of the jobs' label KEY; jobs without it are "
    "the group '(none)')"), examples=["cloud", "label:project"])]
_ERRORS = responses(401, 403, 404, 422, s403="A team's token asking for another team", s404="No such team (admin)")


def _group_by(value: str | None) -> str | None:
    if value is None or value in views.GROUPS:
        return value
    label = views.label_key(value)
    if label is not None and resfields.LABEL_KEY_RE.match(label):
        return value
    raise invalid([{"field": "group_by", "message": f"{value!r}: one of {', '.join(views.GROUPS)}, or label:KEY "
                    "(KEY a label's name: letters, digits, '.', '_', '-', '/')"}])


# What a script may guess the range's names to be: answered with a 422 naming since/until, not
# with the default thirty days, which looked like the answer to the range asked.
GUESSED = {"from": "since", "to": "until", "start": "since", "end": "until"}


def _report(request: Request, session, principal: Principal, name: str, since: datetime | None,
            until: datetime | None, group_by: str | None) -> tuple[datetime, datetime, views.Report]:
    guessed = [{"field": k, "message": f"not a parameter: the range is {v}"} for k, v in GUESSED.items()
               if k in request.query_params]
    if guessed:
        raise invalid(guessed)
    may_read(principal, name)
    group_by = _group_by(group_by)
    now = request.app.state.clock.now()
    since, until = time_range(since, until, now)
    try:
        return since, until, money_cases.costs(session, name, since, until, group_by, now)
    except auth.TeamNotFound as exc:
        raise Problem(404, "Not found", str(exc)) from None


@router.get("/teams/{name}/costs", response_model=CostReport, responses=_ERRORS)
def team_costs(request: Request, session: SessionDep, principal: Caller,
               name: TeamName, since: When = None, until: When = None, group_by: GroupBy = None) -> CostReport:
    """A team's spend with ledger entries starting in [since, until)
    (default: the last 30 days), exact to now."""
    since, until, report = _report(request, session, principal, name, since, until, group_by)
    return CostReport(team=name, since=since, until=until, group_by=group_by, total=Money.of(report.total),
                      groups=[CostGroup(key=k, name=report.names.get(k), **Money.of(m).model_dump())
                              for k, m in report.groups.items()])


@router.get("/teams/{name}/costs.csv", response_class=Response, responses={
    **_ERRORS, 200: {"content": {"text/csv": {}}, "description": "a header row, then a row per group"}})
def team_costs_csv(request: Request, session: SessionDep, principal: Caller,
                   name: TeamName, since: When = None, until: When = None, group_by: GroupBy = None) -> Response:
    """The same report as CSV, for a spreadsheet: a row per group (one
    `total` row ungrouped); a text cell that a spreadsheet would run as a
    formula (starting with = + - @) is written with a leading '."""
    since, until, report = _report(request, session, principal, name, since, until, group_by)
    return Response(export.report_csv(name, since, until, group_by, report), media_type="text/csv; charset=utf-8",
                    headers={"Content-Disposition": f'attachment; filename="costs-{name}.csv"'})
