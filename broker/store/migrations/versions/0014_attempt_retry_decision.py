"""attempts.retry_decision and preempt_signalled_at: endings decided with no crash window

retry_decision: the retry engine's answer, written with the ending it answers.

Until now an attempt that ended in a failure (or a preemption the backend reported) was
committed first and its retry decision taken afterwards, in a transaction of its own; a
process killed between the two left the job FAILED (or RETRYING) for ever. The decision is now
part of the transaction that ends the attempt, and recorded on the attempt: `retry`, `stop`,
or `none` (no retry question: the job had moved on, or went back to the queue unadmitted).

The attempts already ended are backfilled `none`, except those an older version may have left
undecided: the current attempt of a job still FAILED or RETRYING, ended in a failure or a
preemption. Those stay NULL, and the leader's repair (broker.control.requeue.repair_undecided)
asks the retry engine for them once, as the old code would have right after the commit.

ix_attempts_undecided (partial: only undecided endings) makes the repair's periodic look-up
one short index range, however many attempts have ever ended.

preempt_signalled_at: a preemption commits its intent on the victim's attempt before it
signals the backend object, and ends the attempt in a second transaction; a process killed
between the two left the object stopping with nothing recorded, and its ending was read as
the job's own (a user's cancel, or the ranks' exit code as a user error). The reconciler now
reads any unsuccessful ending of an attempt with this mark as its preemption.

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

UNDECIDED = ("retry_decision IS NULL AND ended_at IS NOT NULL "
             "AND (failure IS NOT NULL OR preempted)")


def upgrade() -> None:
    with op.batch_alter_table("attempts") as b:
        b.add_column(sa.Column("retry_decision", sa.String(16), nullable=True))
        b.add_column(sa.Column("preempt_signalled_at", sa.DateTime(timezone=True),
                               nullable=True))
    op.execute(sa.text(
        "UPDATE attempts SET retry_decision = 'none' WHERE ended_at IS NOT NULL AND NOT EXISTS ("
        " SELECT 1 FROM jobs WHERE jobs.id = attempts.job_id AND jobs.attempt = attempts.number"
        " AND jobs.state IN ('FAILED', 'RETRYING'))"
    ))
    op.create_index("ix_attempts_undecided", "attempts", ["job_id", "number"],
                    sqlite_where=sa.text(UNDECIDED), postgresql_where=sa.text(UNDECIDED))


def downgrade() -> None:
    """The index and the column go (the decisions with them: an older version decides after
    the commit, as it always did)."""
    op.drop_index("ix_attempts_undecided", "attempts")
    with op.batch_alter_table("attempts") as b:
        b.drop_column("preempt_signalled_at")
        b.drop_column("retry_decision")
