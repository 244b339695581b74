"""control loop: attempts carry their placement and dispatch state (the outbox), facts,
admission cycle records, retry backoff on jobs

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("attempts") as b:
        b.add_column(sa.Column("backend", sa.String(63), nullable=False, server_default=""))
        b.add_column(sa.Column("pool", sa.String(63), nullable=False, server_default=""))
        b.add_column(sa.Column("flavor", sa.String(63), nullable=False, server_default=""))
        b.add_column(sa.Column("gpus", sa.Integer, nullable=False, server_default="0"))
        b.add_column(sa.Column("dispatch", sa.String(16), nullable=False, server_default="pending"))
        b.add_column(sa.Column("backend_id", sa.String(255), nullable=True))
        b.add_column(sa.Column("dispatched_at", TS, nullable=True))
        b.add_column(sa.Column("started_at", TS, nullable=True))
        b.add_column(sa.Column("phase", sa.String(16), nullable=False, server_default="PENDING"))
        b.add_column(sa.Column("last_seen_at", TS, nullable=True))
        b.add_column(sa.Column("missing_since", TS, nullable=True))
        b.add_column(sa.Column("preempted", sa.Boolean, nullable=False, server_default=sa.false()))
        b.add_column(sa.Column("progress_token_sha256", sa.String(64), nullable=True))
        b.add_column(sa.Column("last_step", sa.Integer, nullable=True))
        b.add_column(sa.Column("last_progress_at", TS, nullable=True))
    op.create_index("ix_attempts_dispatch", "attempts", ["dispatch"])
    op.create_index("ix_attempts_live", "attempts", ["backend", "ended_at"])
    with op.batch_alter_table("jobs") as b:
        b.add_column(sa.Column("not_before", TS, nullable=True))
        b.add_column(sa.Column("exclude_json", sa.Text, nullable=False, server_default="{}"))
    op.create_table(
        "facts",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("backend", sa.String(63), nullable=False),
        sa.Column("backend_name", sa.String(63), nullable=False),
        sa.Column("job_id", sa.String(16), nullable=True),
        sa.Column("attempt", sa.Integer, nullable=True),
        sa.Column("phase", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(40), nullable=False),
        sa.Column("observed_at", TS, nullable=False),
        sa.Column("payload_json", sa.Text, nullable=False),
    )
    op.create_index("ix_facts_name", "facts", ["backend_name"])
    op.create_table(
        "server_secrets",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("value", sa.String(128), nullable=False),
    )
    op.create_table(
        "admission_cycles",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", TS, nullable=False),
        sa.Column("leader_epoch", sa.Integer, nullable=False),
        sa.Column("inputs_digest", sa.String(32), nullable=False),
        sa.Column("record_json", sa.Text, nullable=False),
    )


def downgrade() -> None:
    raise NotImplementedError("Isthmus migrations are forward-only; restore from a backup")
