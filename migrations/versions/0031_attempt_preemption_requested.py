"""attempts.preemption_requested: the team asked for the attempt's preemption
(`simulate-preemption`); a reclaim a team can cause steers only its own
placement and checkpoint interval, not other teams'

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-01
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0031'
down_revision = '0030'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('attempts') as batch:
        batch.add_column(sa.Column('preemption_requested', sa.Boolean(), nullable=False,
                                   server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table('attempts') as batch:
        batch.drop_column('preemption_requested')
