"""attempt logs move from the receiving broker's disk into the database
(`log_chunks`), so that every replica serves and follows every log; logs
already on disk are imported by `spotbroker serve` at its start
(broker/jobs/logimport.py), since a migration does not know the data dir

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-28
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'log_chunks',
        sa.Column('attempt_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
        sa.Column('rank', sa.Integer(), nullable=False),
        sa.Column('start', sa.BigInteger(), nullable=False),
        sa.Column('size', sa.Integer(), nullable=False),
        sa.Column('data', sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(['attempt_id'], ['attempts.id'], name=op.f('fk_log_chunks_attempt_id_attempts'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('attempt_id', 'rank', 'start', name=op.f('pk_log_chunks')),
    )


def downgrade() -> None:
    op.drop_table('log_chunks')
