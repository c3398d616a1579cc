"""team_buckets: the storage prefixes outside the checkpoint root that the
admin lets each team's jobs mount (and whether only to read), so a task
file's `file_mounts: {/data: s3://my-datasets}` can be honoured and the
node's credentials scoped to it

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-28
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('team_buckets',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('team_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('uri', sa.String(length=1024), nullable=False),
    sa.Column('read_only', sa.Boolean(), nullable=False),
    sa.ForeignKeyConstraint(['team_id'], ['teams.id'], name=op.f('fk_team_buckets_team_id_teams'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_team_buckets')),
    sa.UniqueConstraint('team_id', 'uri', name='uq_team_buckets_team_id_uri')
    )
    with op.batch_alter_table('team_buckets', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_team_buckets_team_id'), ['team_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('team_buckets', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_team_buckets_team_id'))
    op.drop_table('team_buckets')
