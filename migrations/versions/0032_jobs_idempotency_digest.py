"""jobs.idempotency_digest: the sha256 of the request that made a job with an
Idempotency-Key, so that a retry is answered with its job by what it sends,
before the spec is judged again against today's policy and clock

Revision ID: 0032
Revises: 0031
Create Date: 2026-12-01
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0032'
down_revision = '0031'
branch_labels = None
depends_on = None


# Plain ALTER TABLE, not batch mode: on SQLite a batch drop copies the table and drops the old
# one, and with foreign keys on that deleted every job's attempts (ON DELETE CASCADE).
def upgrade() -> None:
    op.add_column('jobs', sa.Column('idempotency_digest', sa.String(64), nullable=True))


def downgrade() -> None:
    op.drop_column('jobs', 'idempotency_digest')  # (SQLite >= 3.35: a column of no index or key)
