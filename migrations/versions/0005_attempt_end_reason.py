"""why an attempt ended, as a value code reads (attempts.end_reason)

Rows written before it are filled from their `reason` words, the only
record of it then: a PREEMPTED attempt was "preempted", "vanished" or
"moved"; a FAILED one "no_capacity", "launch_error" or a non-zero "exit N";
and the live attempt of a PREEMPTING job is ending for a move when the job's
reason starts "moving: ", else for a preemption notice.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

LIVE = "('LAUNCHING', 'RUNNING')"


def upgrade() -> None:
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('end_reason', sa.String(length=16), nullable=True))
    op.execute(f"""
        UPDATE attempts SET end_reason = CASE
            WHEN state = 'SUCCEEDED' THEN 'succeeded'
            WHEN state = 'CANCELLED' THEN 'cancelled'
            WHEN state = 'PREEMPTED' AND reason IN ('moved', 'vanished') THEN reason
            WHEN state = 'PREEMPTED' THEN 'preempted'
            WHEN state = 'FAILED' AND reason IN ('no_capacity', 'launch_error') THEN reason
            WHEN state = 'FAILED' THEN 'failed'
        END
        WHERE state NOT IN {LIVE}""")
    op.execute(f"""
        UPDATE attempts SET end_reason = CASE
            WHEN (SELECT reason FROM jobs WHERE jobs.id = attempts.job_id) LIKE 'moving: %' THEN 'moved'
            ELSE 'preempted'
        END
        WHERE state IN {LIVE} AND job_id IN (SELECT id FROM jobs WHERE state = 'PREEMPTING')""")


def downgrade() -> None:
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.drop_column('end_reason')
