"""current price offers and the price sources' leases

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import spotbroker.broker.store.db

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('price_offers',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('cloud', sa.String(length=16), nullable=False),
    sa.Column('region', sa.String(length=64), nullable=False),
    sa.Column('place', sa.String(length=64), nullable=False),
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
    sa.Column('checked_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
    sa.Column('source', sa.String(length=32), nullable=False),
    sa.Column('listed', sa.Boolean(), nullable=False),
    sa.Column('risk', sa.Float(), nullable=True),
    sa.Column('risk_source', sa.String(length=32), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_price_offers')),
    sa.UniqueConstraint('cloud', 'region', 'place', 'instance_type', name='uq_price_offers_key')
    )
    with op.batch_alter_table('price_offers', schema=None) as batch_op:
        batch_op.create_index('ix_price_offers_shape', ['accelerator', 'accelerator_count', 'listed', 'spot_price'],
                              unique=False)
        batch_op.create_index('ix_price_offers_spot', ['listed', 'spot_price'], unique=False)
        batch_op.create_index('ix_price_offers_place', ['cloud', 'instance_type', 'place'], unique=False)
    op.create_table('price_source_leases',
    sa.Column('source', sa.String(length=32), nullable=False),
    sa.Column('owner', sa.String(length=64), nullable=True),
    sa.Column('expires_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=True),
    sa.Column('last_run_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=True),
    sa.Column('last_ok_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=True),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('source', name=op.f('pk_price_source_leases'))
    )


def downgrade() -> None:
    op.drop_table('price_source_leases')
    with op.batch_alter_table('price_offers', schema=None) as batch_op:
        batch_op.drop_index('ix_price_offers_spot')
        batch_op.drop_index('ix_price_offers_place')
        batch_op.drop_index('ix_price_offers_shape')
    op.drop_table('price_offers')
