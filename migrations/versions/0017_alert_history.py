"""alerts keep their history (fired, escalated, resolved, with the figures
then) and when a rate's condition cleared, so it resolves only once clear
for a while instead of flapping between a preempted attempt and its recovery

Revision ID: 0017
Revises: 0014
Create Date: 2026-11-28
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import spotbroker.broker.store.db

revision = '0017'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('alerts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('history', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('clear_since', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('alerts', schema=None) as batch_op:
        batch_op.drop_column('clear_since')
        batch_op.drop_column('history')
