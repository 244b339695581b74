"""Notices: the outbox of notable job events (notices) and their deliveries per target

`notices` is written in the transaction of the job event it tells of (unique `key`: one notice
per event); `notice_deliveries` holds one row per notice and target (webhook URL or mail
address) with its attempts, next try and last error; status `dead` is the dead-letter view.

Downgrade drops both tables.

Revision ID: 0018_notices
Revises: 0017_idle_cycles
"""

import sqlalchemy as sa
from alembic import op

revision = "0018_notices"
down_revision = "0017_idle_cycles"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "notices",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("key", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=24), nullable=False),
        sa.Column("job_id", sa.String(length=16), nullable=True),
        sa.Column("event_seq", sa.Integer(), nullable=True),
        sa.Column("team", sa.String(length=63), nullable=False),
        sa.Column("at", TS, nullable=False),
        sa.Column("details_json", sa.Text(), nullable=True),
        sa.Column("expanded", sa.Boolean(), nullable=False),
        sa.UniqueConstraint("key", name="uq_notices_key"),
    )
    op.create_index("ix_notices_expanded", "notices", ["expanded", "id"])
    op.create_index("ix_notices_job", "notices", ["job_id"])
    op.create_table(
        "notice_deliveries",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("notice_id", sa.Integer(), sa.ForeignKey("notices.id"), nullable=False),
        sa.Column("channel", sa.String(length=8), nullable=False),
        sa.Column("target", sa.String(length=2048), nullable=False),
        sa.Column("status", sa.String(length=12), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_try_at", TS, nullable=False),
        sa.Column("last_error", sa.Text(), nullable=False),
        sa.Column("delivered_at", TS, nullable=True),
        sa.UniqueConstraint("notice_id", "channel", "target", name="uq_notice_deliveries"),
    )
    op.create_index("ix_notice_deliveries_due", "notice_deliveries", ["status", "next_try_at"])


def downgrade() -> None:
    """Drops the outbox and its deliveries (notices not yet sent are lost)."""
    op.drop_index("ix_notice_deliveries_due", "notice_deliveries")
    op.drop_table("notice_deliveries")
    op.drop_index("ix_notices_job", "notices")
    op.drop_index("ix_notices_expanded", "notices")
    op.drop_table("notices")
