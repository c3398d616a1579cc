"""secrets sealed at rest: jobs' `secrets` values and budgets' notification
targets, stored until now in clear, are sealed with the broker's keyring
(broker/store/sealing.py); a downgrade opens them again. And
`upload_reservations`: the per-team upload quota checked and held in one
step across brokers.

The keyring is the caller's (`migrate.upgrade(engine, keyring=...)`, which
the server passes), else the settings' (`spotbroker db upgrade`, the alembic
command line); it is asked for only when there are rows to seal.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from alembic import context, op

from spotbroker.broker.jobs import sealed
from spotbroker.broker.money import budgets
from spotbroker.broker.store.db import UTCDateTime
from spotbroker.broker.store.migrate import migration_keyring

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None

_jobs = sa.table('jobs', sa.column('id', sa.BigInteger), sa.column('team_id', sa.Integer),
                 sa.column('spec', sa.JSON))
_budgets = sa.table('budgets', sa.column('team_id', sa.Integer), sa.column('targets', sa.JSON))


def upgrade() -> None:
    op.create_table('upload_reservations',
                    sa.Column('team_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
                    sa.Column('sha256', sa.String(length=64), nullable=False),
                    sa.Column('bytes', sa.BigInteger(), nullable=False),
                    sa.Column('expires_at', UTCDateTime(timezone=True), nullable=False),
                    sa.ForeignKeyConstraint(['team_id'], ['teams.id'],
                                            name=op.f('fk_upload_reservations_team_id_teams'), ondelete='CASCADE'),
                    sa.PrimaryKeyConstraint('team_id', 'sha256', name=op.f('pk_upload_reservations')))
    _rewrite(lambda keyring, team, spec: sealed.seal(spec, team, keyring),
             lambda keyring, team, targets: [budgets.seal_target(budgets.Target.model_validate(t), team, keyring)
                                             for t in targets])


def downgrade() -> None:
    op.drop_table('upload_reservations')
    _rewrite(lambda keyring, team, spec: sealed.unsealed(spec, team, keyring),
             lambda keyring, team, targets: [
                 t.open(keyring).model_dump(by_alias=True, exclude_none=True)
                 for t in (budgets.StoredTarget(team, s["name"], s["kind"], s["sealed"]) for s in targets)])


def _rewrite(job_spec: Callable[[Any, int, dict], dict], budget_targets: Callable[[Any, int, list], list]) -> None:
    """Each job with secrets and each budget with targets, rewritten in place."""
    conn = op.get_bind()
    keyring = None
    # Only rows whose spec names secrets: a text match first (JSON columns
    # differ by database), then the parsed spec decides.
    rows = conn.execute(sa.select(_jobs.c.id, _jobs.c.team_id, _jobs.c.spec)
                        .where(sa.cast(_jobs.c.spec, sa.Text).like('%"secrets"%'))).all()
    for job_id, team_id, spec in rows:
        spec = json.loads(spec) if isinstance(spec, str) else spec
        if spec.get("secrets"):
            keyring = keyring or migration_keyring(context.config.attributes)
            conn.execute(_jobs.update().where(_jobs.c.id == job_id).values(spec=job_spec(keyring, team_id, spec)))
    for team_id, targets in conn.execute(sa.select(_budgets.c.team_id, _budgets.c.targets)).all():
        targets = json.loads(targets) if isinstance(targets, str) else targets
        if targets:
            keyring = keyring or migration_keyring(context.config.attributes)
            conn.execute(_budgets.update().where(_budgets.c.team_id == team_id)
                         .values(targets=budget_targets(keyring, team_id, targets)))
