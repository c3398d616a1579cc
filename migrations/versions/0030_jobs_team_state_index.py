"""ix_jobs_team_id_state: a team's unfinished jobs are counted at each
submission (SPOTBROKER_MAX_UNFINISHED_JOBS_PER_TEAM), without reading its
finished ones

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-01
"""
from __future__ import annotations

from alembic import op

revision = '0030'
down_revision = '0029'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_jobs_team_id_state', 'jobs', ['team_id', 'state'])


def downgrade() -> None:
    op.drop_index('ix_jobs_team_id_state', table_name='jobs')
