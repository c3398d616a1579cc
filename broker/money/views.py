"""Reads of the ledger: a job's and its attempts' cost, a team's spend over
a time range grouped by day, job, cloud, GPU, zone or a label, a dashboard page's
sums (`breakdown`), every team's totals, and spend over a window (for
budgets and alerts). Each is the written entries plus the tail the next
accrual will write for attempts still open (`ledger.pending`), so every
total is exact to now and all of them agree. A read adds all its open
attempts' tails at once (`unwritten`): a fixed number of statements however
many attempts run."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Date, and_, case, cast, func, literal, null, or_, select, union_all
from sqlalchemy.orm import Session

from spotbroker.broker.jobs.resfields import NO_LABEL
from spotbroker.broker.money import ledger
from spotbroker.broker.store.models import Attempt, Job, JobLabel
from spotbroker.broker.store.moneymodels import LedgerCursor, LedgerEntry

GROUPS = ("day", "job", "cloud", "gpu", "zone")
LABEL = "label:"        # group_by=label:KEY groups by the value of a job's label KEY


def label_key(group_by: str | None) -> str | None:
    """KEY of `label:KEY`; None for another grouping."""
    return group_by[len(LABEL):] if group_by and group_by.startswith(LABEL) else None


@dataclass
class Money:
    cost: float = 0.0
    on_demand_cost: float = 0.0
    wasted: float = 0.0
    node_hours: float = 0.0
    kwh: float = 0.0        # energy at the wall, PUE included
    co2e_kg: float = 0.0    # its emissions at each place's grid intensity

    @property
    def savings(self) -> float:
        return self.on_demand_cost - self.cost

    def add(self, cost: float, on_demand: float, wasted: float, node_hours: float, kwh: float = 0.0,
            co2e_kg: float = 0.0) -> None:
        self.cost += cost
        self.on_demand_cost += on_demand
        self.wasted += wasted
        self.node_hours += node_hours
        self.kwh += kwh
        self.co2e_kg += co2e_kg

    def merge(self, other: Money) -> None:
        self.add(other.cost, other.on_demand_cost, other.wasted, other.node_hours, other.kwh, other.co2e_kg)


@dataclass
class Report:
    total: Money
    groups: dict[str, Money] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)   # job groups: id -> name


# The grain of the unwritten cost a reader adds (accrual writes at most a
# minute apart, so the finest window, 5 minutes, is right to the minute).
PENDING_STEP_S = 60.0


def open_attempts(session: Session, team_id: int | None) -> list[tuple[Attempt, datetime | None, int]]:
    """A team's (or, with None, every team's) attempts whose cost is not all
    written yet, each with how far it is written and its team."""
    query = (select(Attempt, LedgerCursor.accrued_to, Job.team_id).join(Job, Job.id == Attempt.job_id)
             .outerjoin(LedgerCursor, LedgerCursor.attempt_id == Attempt.id)
             .where(Attempt.started_at.is_not(None),
                    or_(LedgerCursor.closed.is_(False), LedgerCursor.attempt_id.is_(None))))
    if team_id is not None:
        query = query.where(Job.team_id == team_id)
    return [tuple(r) for r in session.execute(query)]


@dataclass(frozen=True)
class Unwritten:
    """An open attempt and the entries the next accrual will write for it
    up to now, cut as accrual cuts them (so each piece falls in the window
    it was spent in)."""

    attempt: Attempt
    team_id: int
    drafts: list[ledger.Draft]


def unwritten(session: Session, team_id: int | None, now: datetime) -> list[Unwritten]:
    """A team's (or every team's) open attempts' unwritten tails to `now` (the
    end of a range in the past, for a report of it), in a fixed number of
    statements whatever their number (ledger.pending_all). A tail that starts
    at or after `now` has nothing before it: left out (read to a past `now`,
    it was taken for a correction of everything since, minute by minute: a
    report until 2000 built 14 million entries and took the broker's memory)."""
    opens = [(a, accrued_to, team) for a, accrued_to, team in open_attempts(session, team_id)
             if _tail_before(a, accrued_to, now)]
    tails = ledger.pending_all(session, [(a, accrued_to) for a, accrued_to, _ in opens], now, PENDING_STEP_S)
    return [Unwritten(a, team, drafts) for (a, _, team), (drafts, _, _) in zip(opens, tails, strict=True)]


def _tail_before(attempt: Attempt, accrued_to: datetime | None, now: datetime) -> bool:
    start = accrued_to or attempt.started_at
    if start is None or start < now:
        return True
    # an end committed behind a pass: its correction spans at most that pass's interval
    return attempt.ended_at is not None and attempt.ended_at < start


# --- attempts --------------------------------------------------------------------------


def attempt_costs(session: Session, attempts: Iterable[Attempt], now: datetime,
                  tails: list[Unwritten] | None = None) -> dict[int, float]:
    """attempt id -> dollars to now. `tails`: the unwritten tails of (at
    least) the attempts' team, when the caller has read them already."""
    return {i: m.cost for i, m in attempt_money(session, attempts, now, tails).items()}


def attempt_money(session: Session, attempts: Iterable[Attempt], now: datetime,
                  tails: list[Unwritten] | None = None) -> dict[int, Money]:
    """attempt id -> its dollars, kWh and CO2e to now (as `attempt_costs`; the
    other fields stay 0: the sum reads only what the attempt index carries,
    an index-only scan on PostgreSQL)."""
    attempts = [a for a in attempts if a.started_at is not None]
    if not attempts:
        return {}
    ids = [a.id for a in attempts]
    out: dict[int, Money] = {i: Money() for i in ids}
    for attempt_id, amount, kwh, co2e_kg in session.execute(
            select(LedgerEntry.attempt_id, func.sum(LedgerEntry.amount), func.sum(LedgerEntry.kwh),
                   func.sum(LedgerEntry.co2e_kg))
            .where(LedgerEntry.attempt_id.in_(ids)).group_by(LedgerEntry.attempt_id)):
        out[attempt_id].add(amount or 0.0, 0.0, 0.0, 0.0, kwh or 0.0, co2e_kg or 0.0)
    if tails is None:
        cursors = {r.attempt_id: r for r in session.execute(
            select(LedgerCursor.attempt_id, LedgerCursor.accrued_to, LedgerCursor.closed)
            .where(LedgerCursor.attempt_id.in_(ids)))}
        opens = [(a, cursors[a.id].accrued_to if a.id in cursors else None) for a in attempts
                 if a.id not in cursors or not cursors[a.id].closed]
        tail_of = {a.id: drafts for (a, _), (drafts, _, _)
                   in zip(opens, ledger.pending_all(session, opens, now, PENDING_STEP_S), strict=True)}
    else:
        tail_of = {t.attempt.id: t.drafts for t in tails}
    for attempt_id, drafts in tail_of.items():
        if attempt_id in out:
            for d in drafts:
                out[attempt_id].add(d.amount, 0.0, 0.0, 0.0, d.kwh, d.co2e_kg)
    return out


# --- a team ----------------------------------------------------------------------------


def day_column(session: Session):
    """An entry's UTC day, as the database computes it."""
    if session.get_bind().dialect.name == "postgresql":
        return cast(func.timezone("UTC", LedgerEntry.start_at), Date)
    return func.date(LedgerEntry.start_at)


def _key_columns(session: Session, group_by: str) -> list:
    if group_by == "day":
        return [day_column(session)]
    return {"job": [LedgerEntry.job_id], "cloud": [LedgerEntry.cloud], "gpu": [LedgerEntry.accelerator],
            "zone": [LedgerEntry.cloud, LedgerEntry.region, LedgerEntry.place]}[group_by]


def key(group_by: str, parts: tuple) -> str:
    """A group's key, as the costs API answers it, from its columns' values."""
    if group_by == "day":
        return str(parts[0])[:10]
    if group_by == "gpu":
        return parts[0] or "none"
    if group_by == "zone":
        return "/".join(p for p in parts if p) or "local"
    return str(parts[0])


def draft_key(group_by: str, d: ledger.Draft, a: Attempt) -> str:
    """The key of the group an unwritten entry falls in."""
    parts = {"day": (d.start_at.date().isoformat(),), "job": (a.job_id,), "cloud": (a.cloud,),
             "gpu": (a.accelerator,), "zone": (a.cloud, a.region, ledger.place(a))}[group_by]
    return key(group_by, parts)


def _sums() -> list:
    # A waste entry (wasted > 0, docs/money.md) carries the node-hours lost, which its usage
    # entries already count as run. (`wasted`, not `kind`: PostgreSQL's index carries it.)
    run = case((LedgerEntry.wasted > 0, 0.0), else_=LedgerEntry.node_hours)
    return [func.sum(LedgerEntry.amount), func.sum(LedgerEntry.ondemand_amount), func.sum(LedgerEntry.wasted),
            func.sum(run), func.sum(LedgerEntry.kwh), func.sum(LedgerEntry.co2e_kg)]


SUMS = ("cost", "od", "wasted", "hours", "kwh", "co2e")   # names of `_sums()`'s columns in a subquery


def _values(d: ledger.Draft) -> tuple[float, float, float, float, float, float]:
    return d.amount, d.ondemand_amount, d.wasted, 0.0 if d.wasted > 0 else d.node_hours, d.kwh, d.co2e_kg


def _by_label(team_id: int, label: str, since: datetime, until: datetime):
    """The team's sums per value of a label: first per job (on PostgreSQL an
    index-only scan of the team's entries, as every other grouping), then
    the few job rows joined to their label on its primary key (job, key)."""
    per_job = (select(LedgerEntry.job_id.label("job_id"),
                      *(s.label(n) for s, n in zip(_sums(), SUMS, strict=True)))
               .where(LedgerEntry.team_id == team_id, LedgerEntry.start_at >= since, LedgerEntry.start_at < until)
               .group_by(LedgerEntry.job_id).subquery())
    j = per_job.c
    return (select(JobLabel.value, *(func.sum(j[n]) for n in SUMS))
            .select_from(per_job)
            .outerjoin(JobLabel, and_(JobLabel.job_id == j.job_id, JobLabel.key == label))
            .group_by(JobLabel.value))


def label_values(session: Session, label: str, job_ids: Iterable[int]) -> dict[int, str]:
    """job id -> its value of the label, for those of the jobs that carry it."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    return dict(session.execute(select(JobLabel.job_id, JobLabel.value)
                                .where(JobLabel.key == label, JobLabel.job_id.in_(ids))).all())


def team_costs(session: Session, team_id: int, since: datetime, until: datetime, group_by: str | None,
               now: datetime) -> Report:
    """A team's spend with `start_at` in [since, until), optionally grouped
    (by `GROUPS`, or `label:KEY`: by the value of the jobs' label KEY, jobs
    without it under NO_LABEL)."""
    total, groups = Money(), defaultdict(Money)
    label = label_key(group_by)
    keys = [] if label is not None or not group_by else _key_columns(session, group_by)
    if label is not None:
        query, width = _by_label(team_id, label, since, until), 1
    else:
        query = select(*keys, *_sums()).where(LedgerEntry.team_id == team_id, LedgerEntry.start_at >= since,
                                              LedgerEntry.start_at < until)
        query, width = query.group_by(*keys) if keys else query, len(keys)
    for row in session.execute(query):
        values = [v or 0.0 for v in row[width:]]
        total.add(*values)
        if label is not None:
            groups[row[0] if row[0] is not None else NO_LABEL].add(*values)
        elif group_by:
            groups[key(group_by, tuple(row[:width]))].add(*values)
    tails = unwritten(session, team_id, min(now, until))
    values_of = label_values(session, label, (t.attempt.job_id for t in tails)) if label is not None else {}
    for tail in tails:
        for d in tail.drafts:
            if since <= d.start_at < until:
                total.add(*_values(d))
                if label is not None:
                    groups[values_of.get(tail.attempt.job_id, NO_LABEL)].add(*_values(d))
                elif group_by:
                    groups[draft_key(group_by, d, tail.attempt)].add(*_values(d))
    # job ids in their order ("2" before "10"); the other keys as text
    order = (lambda kv: (len(kv[0]), kv[0])) if group_by == "job" else (lambda kv: kv[0])
    report = Report(total, dict(sorted(groups.items(), key=order)))
    if group_by == "job" and groups:
        report.names = {str(i): n for i, n in session.execute(
            select(Job.id, Job.name).where(Job.id.in_([int(k) for k in groups])))}
    return report


@dataclass
class Breakdown:
    """A team's spend summed two ways, each split by whether it starts at or
    after each of a few instants (`marks`: the page's start, the last 6
    hours, the last hour): by job, and by day, cloud and GPU."""

    by_job: dict[tuple[str, tuple[bool, ...]], Money]
    by_day: dict[tuple[str, str, str, tuple[bool, ...]], Money]
    tails: list[Unwritten]   # the open attempts' unwritten entries it counts


def breakdown(session: Session, team_id: int, since: datetime, now: datetime,
              marks: tuple[datetime, ...]) -> Breakdown:
    """A team's spend with `start_at` in [since, now), keyed as the costs
    API keys its groups, in one statement: the team's entries are read once
    (an index-only scan on PostgreSQL) into cells by day, job, cloud, GPU
    and marks, which are then summed by job and by day, cloud and GPU. A
    page draws every chart, total and burn window from these sums. Written
    entries plus the unwritten tails, which are returned too (an attempt's
    own cost adds them)."""
    day = day_column(session)
    after = [LedgerEntry.start_at >= m for m in marks]
    keys = [day, LedgerEntry.job_id, LedgerEntry.cloud, LedgerEntry.accelerator, *after]
    cells = (select(*(k.label(f"k{i}") for i, k in enumerate(keys)),
                    *(s.label(n) for s, n in zip(_sums(), SUMS, strict=True)))
             .where(LedgerEntry.team_id == team_id, LedgerEntry.start_at >= since, LedgerEntry.start_at < now)
             .group_by(*keys).cte("cells"))
    c = cells.c
    flags = [c[f"k{4 + i}"] for i in range(len(marks))]
    summed = [func.sum(c[n]) for n in SUMS]
    by_day = select(literal("day"), c.k0, null(), c.k2, c.k3, *flags, *summed).group_by(c.k0, c.k2, c.k3, *flags)
    by_job = select(literal("job"), null(), c.k1, null(), null(), *flags, *summed).group_by(c.k1, *flags)
    out = Breakdown(defaultdict(Money), defaultdict(Money), [])
    for part, when, job, cloud, gpu, *rest in session.execute(union_all(by_day, by_job)):
        mark = tuple(bool(f) for f in rest[:len(marks)])
        values = (v or 0.0 for v in rest[len(marks):])
        if part == "job":
            out.by_job[str(job), mark].add(*values)
        else:
            out.by_day[key("day", (when,)), str(cloud), key("gpu", (gpu,)), mark].add(*values)
    out.tails = unwritten(session, team_id, now)
    for tail in out.tails:
        a = tail.attempt
        for d in tail.drafts:
            if since <= d.start_at < now:
                mark = tuple(d.start_at >= m for m in marks)
                out.by_job[str(a.job_id), mark].add(*_values(d))
                out.by_day[draft_key("day", d, a), str(a.cloud), key("gpu", (a.accelerator,)), mark].add(*_values(d))
    return out


def every_team(session: Session, since: datetime, until: datetime, now: datetime) -> dict[int, Money]:
    """Every team's totals with `start_at` in [since, until), as `team_costs`
    gives each, in one statement (and the open attempts' tails, read at once)."""
    out: dict[int, Money] = defaultdict(Money)
    for team_id, *values in session.execute(
            select(LedgerEntry.team_id, *_sums())
            .where(LedgerEntry.start_at >= since, LedgerEntry.start_at < until).group_by(LedgerEntry.team_id)):
        out[team_id].add(*(v or 0.0 for v in values))
    for tail in unwritten(session, None, min(now, until)):
        for d in tail.drafts:
            if since <= d.start_at < until:
                out[tail.team_id].add(*_values(d))
    return out


def spend(session: Session, team_id: int, since: datetime, now: datetime) -> float:
    """A team's dollars from `since` to now (budgets and alerts)."""
    return team_costs(session, team_id, since, now, None, now).total.cost
