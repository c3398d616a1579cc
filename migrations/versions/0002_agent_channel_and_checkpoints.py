"""agent channel and checkpoints

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import spotbroker.broker.store.db

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('checkpoints',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('job_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('attempt_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('step', sa.BigInteger(), nullable=False),
    sa.Column('uri', sa.Text(), nullable=False),
    sa.Column('bytes', sa.BigInteger(), nullable=False),
    sa.Column('seconds', sa.Float(), nullable=True),
    sa.Column('reason', sa.String(length=16), nullable=True),
    sa.Column('keep', sa.Boolean(), nullable=False),
    sa.Column('committed_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['attempt_id'], ['attempts.id'], name=op.f('fk_checkpoints_attempt_id_attempts'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_checkpoints_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_checkpoints')),
    sa.UniqueConstraint('attempt_id', 'step', name='uq_checkpoints_attempt_id_step')
    )
    with op.batch_alter_table('checkpoints', schema=None) as batch_op:
        batch_op.create_index('ix_checkpoints_job_id_step', ['job_id', 'step'], unique=False)

    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('agent_token_digest', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('agent_seq', sa.Integer(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('last_heartbeat_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=True))
        batch_op.create_unique_constraint(batch_op.f('uq_attempts_agent_token_digest'), ['agent_token_digest'])



def downgrade() -> None:
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('uq_attempts_agent_token_digest'), type_='unique')
        batch_op.drop_column('last_heartbeat_at')
        batch_op.drop_column('agent_seq')
        batch_op.drop_column('agent_token_digest')

    with op.batch_alter_table('checkpoints', schema=None) as batch_op:
        batch_op.drop_index('ix_checkpoints_job_id_step')

    op.drop_table('checkpoints')
