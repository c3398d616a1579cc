"""the checkpoint interval in force for each attempt, and why (zone MTBF,
measured checkpoint cost): broker/recovery/intervals.py

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-28
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('checkpoint_interval', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.drop_column('checkpoint_interval')
