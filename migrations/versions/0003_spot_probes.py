"""spot probes, and an index for placement's history query

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import spotbroker.broker.store.db

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('spot_probes',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('cloud', sa.String(length=16), nullable=False),
    sa.Column('region', sa.String(length=64), nullable=True),
    sa.Column('zone', sa.String(length=64), nullable=True),
    sa.Column('zone_id', sa.String(length=64), nullable=True),
    sa.Column('instance_type', sa.String(length=64), nullable=True),
    sa.Column('available', sa.Boolean(), nullable=False),
    sa.Column('at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_spot_probes'))
    )
    with op.batch_alter_table('spot_probes', schema=None) as batch_op:
        batch_op.create_index('ix_spot_probes_at', ['at'], unique=False)
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.create_index('ix_attempts_ended_at', ['ended_at'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.drop_index('ix_attempts_ended_at')
    with op.batch_alter_table('spot_probes', schema=None) as batch_op:
        batch_op.drop_index('ix_spot_probes_at')
    op.drop_table('spot_probes')
