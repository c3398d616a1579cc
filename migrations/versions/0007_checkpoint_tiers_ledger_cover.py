"""checkpoint tiers: which committed checkpoints the broker moved to the
cold tier, and since when a restore of one runs; the ledger's team index
covers the columns a team's view sums and groups (PostgreSQL: index-only
scans), and an index on start_at for every team's spend since a time

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import spotbroker.broker.store.db

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

COVER = ['amount', 'ondemand_amount', 'wasted', 'node_hours', 'job_id', 'cloud', 'region', 'place', 'accelerator']


def upgrade() -> None:
    op.create_table('checkpoint_tiers',
    sa.Column('checkpoint_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('team_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('storage_class', sa.String(length=32), nullable=False),
    sa.Column('archived_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
    sa.Column('restore_requested_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['checkpoint_id'], ['checkpoints.id'],
                            name=op.f('fk_checkpoint_tiers_checkpoint_id_checkpoints'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['team_id'], ['teams.id'], name=op.f('fk_checkpoint_tiers_team_id_teams'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('checkpoint_id', name=op.f('pk_checkpoint_tiers'))
    )
    with op.batch_alter_table('checkpoint_tiers', schema=None) as batch_op:
        batch_op.create_index('ix_checkpoint_tiers_team_id', ['team_id'], unique=False)
    with op.batch_alter_table('ledger_entries', schema=None) as batch_op:
        batch_op.drop_index('ix_ledger_entries_team_id_start_at')
        batch_op.create_index('ix_ledger_entries_team_id_start_at', ['team_id', 'start_at'], unique=False,
                              postgresql_include=COVER)
        batch_op.create_index('ix_ledger_entries_start_at', ['start_at'], unique=False,
                              postgresql_include=['team_id', 'amount'])


def downgrade() -> None:
    with op.batch_alter_table('ledger_entries', schema=None) as batch_op:
        batch_op.drop_index('ix_ledger_entries_start_at')
        batch_op.drop_index('ix_ledger_entries_team_id_start_at')
        batch_op.create_index('ix_ledger_entries_team_id_start_at', ['team_id', 'start_at'], unique=False)
    with op.batch_alter_table('checkpoint_tiers', schema=None) as batch_op:
        batch_op.drop_index('ix_checkpoint_tiers_team_id')

    op.drop_table('checkpoint_tiers')
