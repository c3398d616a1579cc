"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-21
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import spotbroker.broker.store.db

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('offers',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('cloud', sa.String(length=16), nullable=False),
    sa.Column('region', sa.String(length=64), nullable=False),
    sa.Column('zone', sa.String(length=64), nullable=True),
    sa.Column('zone_id', sa.String(length=64), nullable=True),
    sa.Column('instance_type', sa.String(length=64), nullable=False),
    sa.Column('accelerator', sa.String(length=32), nullable=True),
    sa.Column('accelerator_count', sa.Float(), nullable=False),
    sa.Column('vcpus', sa.Float(), nullable=True),
    sa.Column('memory_gib', sa.Float(), nullable=True),
    sa.Column('spot_price', sa.Float(), nullable=True),
    sa.Column('ondemand_price', sa.Float(), nullable=True),
    sa.Column('observed_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
    sa.Column('source', sa.String(length=32), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_offers'))
    )
    with op.batch_alter_table('offers', schema=None) as batch_op:
        batch_op.create_index('ix_offers_accelerator', ['accelerator'], unique=False)
        batch_op.create_index('ix_offers_key', ['cloud', 'instance_type', 'region', 'zone_id', 'observed_at'], unique=False)

    op.create_table('teams',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('created_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_teams')),
    sa.UniqueConstraint('name', name=op.f('uq_teams_name'))
    )
    op.create_table('api_tokens',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('team_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('digest', sa.String(length=64), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('created_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
    sa.Column('revoked_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['team_id'], ['teams.id'], name=op.f('fk_api_tokens_team_id_teams'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_tokens')),
    sa.UniqueConstraint('digest', name=op.f('uq_api_tokens_digest'))
    )
    with op.batch_alter_table('api_tokens', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_api_tokens_team_id'), ['team_id'], unique=False)

    op.create_table('jobs',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('team_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.Column('idempotency_key', sa.String(length=128), nullable=True),
    sa.Column('restarts', sa.Integer(), nullable=False),
    sa.Column('recoveries', sa.Integer(), nullable=False),
    sa.Column('created_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
    sa.Column('updated_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
    sa.Column('ended_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=True),
    sa.Column('next_check_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=True),
    sa.Column('lease_owner', sa.String(length=64), nullable=True),
    sa.Column('lease_expires_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=True),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['team_id'], ['teams.id'], name=op.f('fk_jobs_team_id_teams'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_jobs')),
    sa.UniqueConstraint('team_id', 'idempotency_key', name='uq_jobs_team_id_idempotency_key')
    )
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.create_index('ix_jobs_due', ['state', 'next_check_at'], unique=False)
        batch_op.create_index('ix_jobs_team_id_id', ['team_id', 'id'], unique=False)

    op.create_table('attempts',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('job_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('launcher', sa.String(length=16), nullable=False),
    sa.Column('cloud', sa.String(length=16), nullable=False),
    sa.Column('region', sa.String(length=64), nullable=True),
    sa.Column('zone', sa.String(length=64), nullable=True),
    sa.Column('zone_id', sa.String(length=64), nullable=True),
    sa.Column('instance_type', sa.String(length=64), nullable=True),
    sa.Column('accelerator', sa.String(length=32), nullable=True),
    sa.Column('accelerator_count', sa.Float(), nullable=False),
    sa.Column('use_spot', sa.Boolean(), nullable=False),
    sa.Column('num_nodes', sa.Integer(), nullable=False),
    sa.Column('price_per_hour', sa.Float(), nullable=False),
    sa.Column('handle', sa.JSON(), nullable=True),
    sa.Column('exit_code', sa.Integer(), nullable=True),
    sa.Column('released', sa.Boolean(), nullable=False),
    sa.Column('created_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
    sa.Column('updated_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
    sa.Column('started_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=True),
    sa.Column('ended_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=True),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_attempts_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_attempts'))
    )
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_attempts_job_id'), ['job_id'], unique=False)

    op.create_table('events',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('job_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('attempt_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
    sa.Column('type', sa.String(length=32), nullable=False),
    sa.Column('at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
    sa.Column('data', sa.JSON(), nullable=False),
    sa.ForeignKeyConstraint(['attempt_id'], ['attempts.id'], name=op.f('fk_events_attempt_id_attempts'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_events_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_events'))
    )
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.create_index('ix_events_job_id_id', ['job_id', 'id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.drop_index('ix_events_job_id_id')

    op.drop_table('events')
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_attempts_job_id'))

    op.drop_table('attempts')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index('ix_jobs_team_id_id')
        batch_op.drop_index('ix_jobs_due')

    op.drop_table('jobs')
    with op.batch_alter_table('api_tokens', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_api_tokens_team_id'))

    op.drop_table('api_tokens')
    op.drop_table('teams')
    with op.batch_alter_table('offers', schema=None) as batch_op:
        batch_op.drop_index('ix_offers_key')
        batch_op.drop_index('ix_offers_accelerator')

    op.drop_table('offers')
