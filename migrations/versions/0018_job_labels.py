"""job_labels: each job's labels (`resources.labels`, SkyPilot's key) a row
each, so that costs group by a label (`group_by=label:project`) with a join
on an index; the labels of jobs already stored are copied from their specs

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade() -> None:
    op.create_table('job_labels',
    sa.Column('job_id', BigId, nullable=False),
    sa.Column('key', sa.String(length=128), nullable=False),
    sa.Column('team_id', BigId, nullable=False),
    sa.Column('value', sa.String(length=256), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_job_labels_job_id_jobs'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['team_id'], ['teams.id'], name=op.f('fk_job_labels_team_id_teams'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('job_id', 'key', name=op.f('pk_job_labels'))
    )
    with op.batch_alter_table('job_labels', schema=None) as batch_op:
        batch_op.create_index('ix_job_labels_team_id_key_value', ['team_id', 'key', 'value'], unique=False)
    _copy_from_specs()


def _copy_from_specs() -> None:
    """The labels of the jobs stored before: read from each spec, a page at a time."""
    from spotbroker.broker.jobs.spec import labels_of

    conn = op.get_bind()
    jobs = sa.table('jobs', sa.column('id', BigId), sa.column('team_id', BigId), sa.column('spec', sa.JSON()))
    labels = sa.table('job_labels', sa.column('job_id', BigId), sa.column('key', sa.String()),
                      sa.column('team_id', BigId), sa.column('value', sa.String()))
    after = 0
    while True:
        page = conn.execute(sa.select(jobs.c.id, jobs.c.team_id, jobs.c.spec).where(jobs.c.id > after)
                            .order_by(jobs.c.id).limit(1000)).all()
        if not page:
            return
        rows = [dict(job_id=i, key=k, team_id=team, value=v) for i, team, spec in page
                for k, v in labels_of(spec if isinstance(spec, dict) else {}).items()]
        if rows:
            conn.execute(sa.insert(labels), rows)
        after = page[-1][0]


def downgrade() -> None:
    with op.batch_alter_table('job_labels', schema=None) as batch_op:
        batch_op.drop_index('ix_job_labels_team_id_key_value')
    op.drop_table('job_labels')
