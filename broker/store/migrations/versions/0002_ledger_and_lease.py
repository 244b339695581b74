"""quota ledger (append-only entries + usage counters) and the leader lease

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "ledger_entries",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(16), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("team", sa.String(63), nullable=False),
        sa.Column("flavor", sa.String(63), nullable=False),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("borrowed_gpus", sa.Integer, nullable=False, server_default="0"),
        sa.Column("gpu_hours", sa.Float, nullable=False, server_default="0"),
        sa.Column("at", TS, nullable=False),
        sa.Column("note", sa.Text, nullable=False, server_default=""),
        sa.UniqueConstraint("job_id", "attempt", "kind", name="uq_ledger_job_attempt_kind"),
    )
    op.create_index("ix_ledger_team_flavor", "ledger_entries", ["team", "flavor"])
    op.create_table(
        "quota_usage",
        sa.Column("team", sa.String(63), primary_key=True),
        sa.Column("flavor", sa.String(63), primary_key=True),
        sa.Column("reserved_gpus", sa.Integer, nullable=False, server_default="0"),
        sa.Column("borrowed_gpus", sa.Integer, nullable=False, server_default="0"),
        sa.CheckConstraint("reserved_gpus >= 0", name="ck_quota_usage_reserved"),
        sa.CheckConstraint("borrowed_gpus >= 0", name="ck_quota_usage_borrowed"),
    )
    op.create_table(
        "leader_lease",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("epoch", sa.Integer, nullable=False),
        sa.Column("expires_at", TS, nullable=False),
    )
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        op.execute(
            """
            CREATE FUNCTION isthmus_ledger_append_only() RETURNS trigger AS $$
            BEGIN RAISE EXCEPTION 'ledger_entries is append-only'; END $$ LANGUAGE plpgsql
            """
        )
        op.execute(
            "CREATE TRIGGER ledger_append_only BEFORE UPDATE OR DELETE ON ledger_entries "
            "FOR EACH ROW EXECUTE FUNCTION isthmus_ledger_append_only()"
        )
    else:
        for action in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER ledger_no_{action.lower()} BEFORE {action} ON ledger_entries "
                "BEGIN SELECT RAISE(ABORT, 'ledger_entries is append-only'); END"
            )


def downgrade() -> None:
    raise NotImplementedError("Isthmus migrations are forward-only; restore from a backup")
