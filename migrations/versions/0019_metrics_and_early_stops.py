"""metric_points (what trainers report with ckpt.report, per attempt) and
early_stops (a job whose early_stop rule fired, and the checkpoint kept)

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-28
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import spotbroker.broker.store.db

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')
UTC = spotbroker.broker.store.db.UTCDateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        'metric_points',
        sa.Column('id', BigId, nullable=False),
        sa.Column('job_id', BigId, nullable=False),
        sa.Column('attempt_id', BigId, nullable=False),
        sa.Column('step', sa.BigInteger(), nullable=False),
        sa.Column('name', sa.String(length=64), nullable=False),
        sa.Column('value', sa.Float(), nullable=False),
        sa.Column('at', UTC, nullable=False),
        sa.ForeignKeyConstraint(['attempt_id'], ['attempts.id'], name=op.f('fk_metric_points_attempt_id_attempts'),
                                ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_metric_points_job_id_jobs'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_metric_points')),
    )
    op.create_index('ix_metric_points_job_id_name_step', 'metric_points', ['job_id', 'name', 'step'])
    op.create_index(op.f('ix_metric_points_attempt_id'), 'metric_points', ['attempt_id'])
    op.create_table(
        'early_stops',
        sa.Column('job_id', BigId, nullable=False),
        sa.Column('attempt_id', BigId, nullable=False),
        sa.Column('metric', sa.String(length=64), nullable=False),
        sa.Column('decided_at', UTC, nullable=False),
        sa.Column('step', sa.BigInteger(), nullable=False),
        sa.Column('best_step', sa.BigInteger(), nullable=False),
        sa.Column('best_value', sa.Float(), nullable=False),
        sa.Column('finished_at', UTC, nullable=True),
        sa.Column('stopped_step', sa.BigInteger(), nullable=True),
        sa.Column('checkpoint_id', BigId, nullable=True),
        sa.Column('checkpoint_choice', sa.String(length=16), nullable=True),
        sa.ForeignKeyConstraint(['attempt_id'], ['attempts.id'], name=op.f('fk_early_stops_attempt_id_attempts'),
                                ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['checkpoint_id'], ['checkpoints.id'],
                                name=op.f('fk_early_stops_checkpoint_id_checkpoints'), ondelete='SET NULL'),
        sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_early_stops_job_id_jobs'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('job_id', name=op.f('pk_early_stops')),
    )


def downgrade() -> None:
    op.drop_table('early_stops')
    op.drop_index(op.f('ix_metric_points_attempt_id'), table_name='metric_points')
    op.drop_index('ix_metric_points_job_id_name_step', table_name='metric_points')
    op.drop_table('metric_points')
