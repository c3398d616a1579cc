"""what the aws-public price source remembers of AWS's price-list files
(each file's version, ETag and the rows kept of it), shared by every broker
on the database

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import spotbroker.broker.store.db

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('price_list_files',
    sa.Column('source', sa.String(length=32), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('version', sa.String(length=512), nullable=True),
    sa.Column('etag', sa.String(length=256), nullable=True),
    sa.Column('body', sa.Text(), nullable=False),
    sa.Column('fetched_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('source', 'name', name=op.f('pk_price_list_files'))
    )


def downgrade() -> None:
    op.drop_table('price_list_files')
