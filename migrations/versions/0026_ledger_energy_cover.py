"""the ledger's team and attempt indexes carry kwh and co2e_kg: the costs
API, the dashboard and a job's read now sum them beside the dollars, and
on PostgreSQL each of those reads stays an index-only scan (as 0007 and
0012 made it) only if every summed column is in the index

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-28
"""
from __future__ import annotations

from alembic import op

revision = '0026'
down_revision = '0025'
branch_labels = None
depends_on = None

TEAM_COVER = ['amount', 'ondemand_amount', 'wasted', 'node_hours', 'job_id', 'cloud', 'region', 'place',
              'accelerator']
ENERGY = ['kwh', 'co2e_kg']


def _indexes(team_cover: list[str], attempt_cover: list[str]) -> None:
    with op.batch_alter_table('ledger_entries', schema=None) as batch_op:
        batch_op.drop_index('ix_ledger_entries_team_id_start_at')
        batch_op.create_index('ix_ledger_entries_team_id_start_at', ['team_id', 'start_at'], unique=False,
                              postgresql_include=team_cover)
        batch_op.drop_index('ix_ledger_entries_attempt_id')
        batch_op.create_index('ix_ledger_entries_attempt_id', ['attempt_id'], unique=False,
                              postgresql_include=attempt_cover)


def upgrade() -> None:
    _indexes(TEAM_COVER + ENERGY, ['amount'] + ENERGY)


def downgrade() -> None:
    _indexes(TEAM_COVER, ['amount'])
