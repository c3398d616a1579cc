"""broker_replicas.signing_key_check: a digest of each running broker's
signing key (SPOTBROKER_SECRET_KEY, or its data directory's own), so that a
broker started with a key other than the live ones' is refused at its start:
agent tokens, dashboard sessions and the secrets sealed with one key did
not work on the other broker, and nothing said why

Revision ID: 0028
Revises: 0027
Create Date: 2026-11-30
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0028'
down_revision = '0027'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('broker_replicas') as batch:
        batch.add_column(sa.Column('signing_key_check', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('broker_replicas') as batch:
        batch.drop_column('signing_key_check')
