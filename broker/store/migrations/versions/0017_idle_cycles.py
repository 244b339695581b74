"""admission_cycles.repeats and last_at: an idle cycle is stored once, with a count

The admission cycle runs every second; one that has no job to decide (nothing queued, or
only held jobs) changes nothing and explains nothing, yet each stored a row: 86,400 rows a
day of an idle federation. A run of idle cycles of one leader is now one row: the first
cycle's, with `repeats` (the idle cycles folded into it after the first) and `last_at` (when
the last of them ran). Existing rows get repeats 0.

Downgrade drops both columns (a folded row then reads as the one cycle it started with).

Revision ID: 0017_idle_cycles
Revises: 0016_job_holds
"""

import sqlalchemy as sa
from alembic import op

revision = "0017_idle_cycles"
down_revision = "0016_job_holds"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("admission_cycles") as b:
        b.add_column(sa.Column("repeats", sa.Integer(), nullable=False, server_default="0"))
        b.add_column(sa.Column("last_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("admission_cycles") as b:
        b.drop_column("last_at")
        b.drop_column("repeats")
