"""Requests to requeue a running job (scontrol requeue / requeuehold): job_requeues

Revision ID: 0019_job_requeues
Revises: 0018_notices
"""

import sqlalchemy as sa
from alembic import op

revision = "0019_job_requeues"
down_revision = "0018_notices"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_requeues",
        sa.Column("job_id", sa.String(length=16), sa.ForeignKey("jobs.id"), primary_key=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("requested_by", sa.String(length=255), nullable=False),
        sa.Column("hold", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("job_requeues")
