"""A user's holds on queued jobs (scontrol hold / release, sbatch --hold): job_holds

Revision ID: 0016_job_holds
Revises: 0015_job_number
"""

import sqlalchemy as sa
from alembic import op

revision = "0016_job_holds"
down_revision = "0015_job_number"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_holds",
        sa.Column("job_id", sa.String(length=16), sa.ForeignKey("jobs.id"), primary_key=True),
        sa.Column("held_by", sa.String(length=255), nullable=False),
        sa.Column("held_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("job_holds")
