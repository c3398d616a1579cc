"""Key rotation: every sealed value in the database brought under the
keyring's current key (`spotbroker db reseal`), after which the old key can
be dropped from SPOTBROKER_ENCRYPTION_KEYS (docs/security.md).

Rows are rewritten in small transactions, each holding its rows locked, so
brokers keep running meanwhile: a job's row carries a version, and a broker
stepping the same job retries its step instead of overwriting the new seal.
A value that does not open is reported and left as it is. Running it again
rewrites nothing that is already current.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Text, cast, select
from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker.jobs import sealed
from spotbroker.broker.money import budgets
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Job
from spotbroker.broker.store.moneymodels import Budget
from spotbroker.broker.store.sealing import Keyring, SealError

BATCH = 200


@dataclass
class Resealed:
    jobs: int = 0
    budgets: int = 0
    unreadable: list[str] = field(default_factory=list)  # "job 12: why", never a value


def reseal(factory: sessionmaker[Session], keyring: Keyring) -> Resealed:
    out = Resealed()
    last = 0
    while True:
        with transaction(factory) as session:
            rows = list(session.scalars(
                select(Job).where(Job.id > last, cast(Job.spec, Text).like('%"secrets"%'))
                .order_by(Job.id).limit(BATCH).with_for_update()))
            for job in rows:
                try:
                    spec = sealed.resealed(job.spec, job.team_id, keyring)
                except SealError as exc:
                    out.unreadable.append(f"job {job.id}: {exc}")
                    continue
                if spec is not None:
                    job.spec, out.jobs = spec, out.jobs + 1
        if len(rows) < BATCH:
            break
        last = rows[-1].id
    with transaction(factory) as session:
        for row in session.scalars(select(Budget).order_by(Budget.team_id).with_for_update()):
            try:
                targets = budgets.resealed_targets(row, keyring)
            except SealError as exc:
                out.unreadable.append(f"budget of team {row.team_id}: {exc}")
                continue
            if targets is not None:
                row.targets, out.budgets = targets, out.budgets + 1
    return out
