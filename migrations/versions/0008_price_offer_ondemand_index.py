"""current offers in on-demand price order: the placement path's cheapest
on-demand offer of a shape and `/v1/prices?spot=false` read an index as the
spot-price ones already do

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25
"""
from __future__ import annotations

from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('price_offers', schema=None) as batch_op:
        batch_op.create_index('ix_price_offers_shape_od',
                              ['accelerator', 'accelerator_count', 'listed', 'ondemand_price'], unique=False)
        batch_op.create_index('ix_price_offers_ondemand', ['listed', 'ondemand_price'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('price_offers', schema=None) as batch_op:
        batch_op.drop_index('ix_price_offers_ondemand')
        batch_op.drop_index('ix_price_offers_shape_od')
