"""attempts.events_kept: how many of the events a trainer reports through its
agent (resumed, no_flush, checkpoint_committed...) the job's history stores
for the attempt; past a bound they are acted on but not stored (a trainer
that wrote 10,000 padded events an attempt grew the database 40 MB each)

Revision ID: 0029
Revises: 0028
Create Date: 2026-11-30
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0029'
down_revision = '0028'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('attempts') as batch:
        batch.add_column(sa.Column('events_kept', sa.Integer(), nullable=False, server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('attempts') as batch:
        batch.drop_column('events_kept')
