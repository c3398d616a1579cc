"""energy and emissions: each attempt's power at the wall and its grid's
intensity (fixed at launch, like its price), the grids' live readings, the GPUs' measured energy,
and kWh and kg CO2e on every ledger entry

Revision ID: 0025
Revises: 0023
Create Date: 2026-11-28
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import spotbroker.broker.store.db

revision = '0025'
down_revision = '0023'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'grid_readings',
        sa.Column('zone', sa.String(length=64), nullable=False),
        sa.Column('at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column('g_per_kwh', sa.Float(), nullable=False),
        sa.Column('estimated', sa.Boolean(), nullable=False),
        sa.Column('source', sa.String(length=32), nullable=False),
        sa.Column('observed_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('zone', 'at', name=op.f('pk_grid_readings')),
    )
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('power_kw', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('grid_g_per_kwh', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('grid_source', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('energy_basis', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('gpu_joules', sa.Float(), nullable=True))
    with op.batch_alter_table('ledger_entries', schema=None) as batch_op:
        batch_op.add_column(sa.Column('kwh', sa.Float(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('co2e_kg', sa.Float(), server_default='0', nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('ledger_entries', schema=None) as batch_op:
        batch_op.drop_column('co2e_kg')
        batch_op.drop_column('kwh')
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.drop_column('gpu_joules')
        batch_op.drop_column('energy_basis')
        batch_op.drop_column('grid_source')
        batch_op.drop_column('grid_g_per_kwh')
        batch_op.drop_column('power_kw')
    op.drop_table('grid_readings')
