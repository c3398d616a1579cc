"""dashboard sessions stored server-side: a row per browser login (the
digest of the cookie's random id), so logging out, idling and the token's
revocation end it everywhere

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import spotbroker.broker.store.db

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('dashboard_sessions',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('digest', sa.String(length=64), nullable=False),
    sa.Column('api_token_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
    sa.Column('admin_print', sa.String(length=16), nullable=True),
    sa.Column('created_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
    sa.Column('last_seen_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
    sa.Column('expires_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['api_token_id'], ['api_tokens.id'],
                            name=op.f('fk_dashboard_sessions_api_token_id_api_tokens'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_dashboard_sessions')),
    sa.UniqueConstraint('digest', name=op.f('uq_dashboard_sessions_digest'))
    )
    with op.batch_alter_table('dashboard_sessions', schema=None) as batch_op:
        batch_op.create_index('ix_dashboard_sessions_expires_at', ['expires_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_dashboard_sessions_api_token_id'), ['api_token_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('dashboard_sessions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_dashboard_sessions_api_token_id'))
        batch_op.drop_index('ix_dashboard_sessions_expires_at')
    op.drop_table('dashboard_sessions')
