"""team_policies: the admin's defaults and limits per team (default envs,
allowed accelerators, $/h and nodes per job, GPUs at once, spec defaults,
checkpoint retention), read at submission and by the reconciler

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-28
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import spotbroker.broker.store.db

revision = '0023'
down_revision = '0022'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('team_policies',
    sa.Column('team_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('document', sa.JSON(), nullable=False),
    sa.Column('updated_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['team_id'], ['teams.id'], name=op.f('fk_team_policies_team_id_teams'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('team_id', name=op.f('pk_team_policies'))
    )


def downgrade() -> None:
    op.drop_table('team_policies')
