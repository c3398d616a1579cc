"""broker_replicas: each running broker's settings that brokers on one
database must share (the checkpoint root, the address nodes report to),
so that a broker started with others' differing is refused at its start
instead of losing checkpoints silently

Revision ID: 0027
Revises: 0026
Create Date: 2026-11-30
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0027'
down_revision = '0026'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'broker_replicas',
        sa.Column('id', sa.String(length=64), nullable=False),
        sa.Column('host', sa.String(length=255), nullable=False),
        sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('seen_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('checkpoint_root', sa.Text(), nullable=False),
        sa.Column('advertise_url', sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint('id'),
    )


def downgrade() -> None:
    op.drop_table('broker_replicas')
