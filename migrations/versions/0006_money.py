"""money: the cost ledger (append-only entries, and how far each attempt is
accrued), the background duties' leases, budgets, alerts, silences and the
notification outbox

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import spotbroker.broker.store.db

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('money_leases',
    sa.Column('name', sa.String(length=32), nullable=False),
    sa.Column('owner', sa.String(length=64), nullable=True),
    sa.Column('expires_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=True),
    sa.Column('last_run_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_money_leases'))
    )
    op.create_table('alert_silences',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('team_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('rule', sa.String(length=32), nullable=False),
    sa.Column('until', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
    sa.Column('created_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['team_id'], ['teams.id'], name=op.f('fk_alert_silences_team_id_teams'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_alert_silences'))
    )
    with op.batch_alter_table('alert_silences', schema=None) as batch_op:
        batch_op.create_index('ix_alert_silences_team_id_rule', ['team_id', 'rule'], unique=False)

    op.create_table('alerts',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('team_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('rule', sa.String(length=32), nullable=False),
    sa.Column('open_key', sa.String(length=128), nullable=True),
    sa.Column('severity', sa.String(length=16), nullable=False),
    sa.Column('summary', sa.Text(), nullable=False),
    sa.Column('advice', sa.Text(), nullable=False),
    sa.Column('value', sa.Float(), nullable=True),
    sa.Column('threshold', sa.Float(), nullable=True),
    sa.Column('fired_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
    sa.Column('resolved_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['team_id'], ['teams.id'], name=op.f('fk_alerts_team_id_teams'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_alerts')),
    sa.UniqueConstraint('open_key', name='uq_alerts_open_key')
    )
    with op.batch_alter_table('alerts', schema=None) as batch_op:
        batch_op.create_index('ix_alerts_team_id_id', ['team_id', 'id'], unique=False)

    op.create_table('budgets',
    sa.Column('team_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('amount', sa.Float(), nullable=False),
    sa.Column('period', sa.String(length=16), nullable=False),
    sa.Column('hard_cap_action', sa.String(length=16), nullable=False),
    sa.Column('recoveries', sa.String(length=16), nullable=False),
    sa.Column('rules', sa.JSON(), nullable=False),
    sa.Column('targets', sa.JSON(), nullable=False),
    sa.Column('created_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
    sa.Column('updated_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['team_id'], ['teams.id'], name=op.f('fk_budgets_team_id_teams'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('team_id', name=op.f('pk_budgets'))
    )
    op.create_table('notifications',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('alert_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('team_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('target', sa.String(length=64), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('title', sa.Text(), nullable=False),
    sa.Column('body', sa.Text(), nullable=False),
    sa.Column('tries', sa.Integer(), nullable=False),
    sa.Column('next_try_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
    sa.Column('sent_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=True),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('created_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['alert_id'], ['alerts.id'], name=op.f('fk_notifications_alert_id_alerts'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['team_id'], ['teams.id'], name=op.f('fk_notifications_team_id_teams'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_notifications')),
    sa.UniqueConstraint('alert_id', 'target', 'kind', name='uq_notifications_alert_id')
    )
    with op.batch_alter_table('notifications', schema=None) as batch_op:
        batch_op.create_index('ix_notifications_due', ['sent_at', 'next_try_at'], unique=False)

    op.create_table('ledger_cursors',
    sa.Column('attempt_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('team_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('accrued_to', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
    sa.Column('closed', sa.Boolean(), nullable=False),
    sa.ForeignKeyConstraint(['attempt_id'], ['attempts.id'], name=op.f('fk_ledger_cursors_attempt_id_attempts'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['team_id'], ['teams.id'], name=op.f('fk_ledger_cursors_team_id_teams'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('attempt_id', name=op.f('pk_ledger_cursors'))
    )
    with op.batch_alter_table('ledger_cursors', schema=None) as batch_op:
        batch_op.create_index('ix_ledger_cursors_closed', ['closed'], unique=False)

    op.create_table('ledger_entries',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('team_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('job_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('attempt_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('start_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
    sa.Column('end_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
    sa.Column('node_hours', sa.Float(), nullable=False),
    sa.Column('price_per_hour', sa.Float(), nullable=False),
    sa.Column('amount', sa.Float(), nullable=False),
    sa.Column('ondemand_amount', sa.Float(), nullable=False),
    sa.Column('wasted', sa.Float(), nullable=False),
    sa.Column('cloud', sa.String(length=16), nullable=False),
    sa.Column('region', sa.String(length=64), nullable=True),
    sa.Column('place', sa.String(length=64), nullable=True),
    sa.Column('accelerator', sa.String(length=32), nullable=True),
    sa.Column('use_spot', sa.Boolean(), nullable=False),
    sa.Column('note', sa.Text(), nullable=True),
    sa.Column('created_at', spotbroker.broker.store.db.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['attempt_id'], ['attempts.id'], name=op.f('fk_ledger_entries_attempt_id_attempts'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_ledger_entries_job_id_jobs'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['team_id'], ['teams.id'], name=op.f('fk_ledger_entries_team_id_teams'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_ledger_entries'))
    )
    with op.batch_alter_table('ledger_entries', schema=None) as batch_op:
        batch_op.create_index('ix_ledger_entries_attempt_id', ['attempt_id'], unique=False)
        batch_op.create_index('ix_ledger_entries_job_id', ['job_id'], unique=False)
        batch_op.create_index('ix_ledger_entries_team_id_start_at', ['team_id', 'start_at'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('ledger_entries', schema=None) as batch_op:
        batch_op.drop_index('ix_ledger_entries_team_id_start_at')
        batch_op.drop_index('ix_ledger_entries_job_id')
        batch_op.drop_index('ix_ledger_entries_attempt_id')

    op.drop_table('ledger_entries')
    with op.batch_alter_table('ledger_cursors', schema=None) as batch_op:
        batch_op.drop_index('ix_ledger_cursors_closed')

    op.drop_table('ledger_cursors')
    with op.batch_alter_table('notifications', schema=None) as batch_op:
        batch_op.drop_index('ix_notifications_due')

    op.drop_table('notifications')
    op.drop_table('budgets')
    with op.batch_alter_table('alerts', schema=None) as batch_op:
        batch_op.drop_index('ix_alerts_team_id_id')

    op.drop_table('alerts')
    with op.batch_alter_table('alert_silences', schema=None) as batch_op:
        batch_op.drop_index('ix_alert_silences_team_id_rule')

    op.drop_table('alert_silences')
    op.drop_table('money_leases')
