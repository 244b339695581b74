"""jobs, job_events (append-only), attempts

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(16), primary_key=True),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("team", sa.String(63), nullable=False),
        sa.Column("queue", sa.String(63), nullable=False),
        sa.Column("priority", sa.String(63), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(40), nullable=False),
        sa.Column("message", sa.Text, nullable=False, server_default=""),
        sa.Column("attempt", sa.Integer, nullable=False, server_default="0"),
        sa.Column("last_seq", sa.Integer, nullable=False, server_default="0"),
        sa.Column("total_gpus", sa.Integer, nullable=False),
        sa.Column("spec_json", sa.Text, nullable=False),
        sa.Column("spec_hash", sa.String(64), nullable=False),
        sa.Column("idempotency_key", sa.String(255), nullable=True),
        sa.Column("submitted_by", sa.String(255), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("first_useful_work_at", TS, nullable=True),
        sa.UniqueConstraint("team", "idempotency_key", name="uq_jobs_team_idempotency_key"),
    )
    op.create_index("ix_jobs_team_state", "jobs", ["team", "state"])
    op.create_index("ix_jobs_state", "jobs", ["state"])
    op.create_table(
        "job_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(16), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("at", TS, nullable=False),
        sa.Column("from_state", sa.String(16), nullable=True),
        sa.Column("to_state", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(40), nullable=False),
        sa.Column("message", sa.Text, nullable=False, server_default=""),
        sa.Column("cause_kind", sa.String(32), nullable=False),
        sa.Column("cause_key", sa.String(255), nullable=True),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False, server_default="0"),
        sa.Column("facts_ref", sa.String(255), nullable=True),
        sa.Column("details_json", sa.Text, nullable=True),
        sa.UniqueConstraint("job_id", "seq", name="uq_job_events_job_seq"),
        sa.UniqueConstraint("job_id", "cause_key", name="uq_job_events_job_cause"),
    )
    op.create_table(
        "attempts",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(16), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("number", sa.Integer, nullable=False),
        sa.Column("snapshot_json", sa.Text, nullable=False),
        sa.Column("spec_hash", sa.String(64), nullable=False),
        sa.Column("backend_name", sa.String(63), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("ended_at", TS, nullable=True),
        sa.Column("failure", sa.String(32), nullable=True),
        sa.UniqueConstraint("job_id", "number", name="uq_attempts_job_number"),
    )
    # Append-only is enforced by the database, not only by convention.
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        op.execute(
            """
            CREATE FUNCTION isthmus_job_events_append_only() RETURNS trigger AS $$
            BEGIN RAISE EXCEPTION 'job_events is append-only'; END $$ LANGUAGE plpgsql
            """
        )
        op.execute(
            "CREATE TRIGGER job_events_append_only BEFORE UPDATE OR DELETE ON job_events "
            "FOR EACH ROW EXECUTE FUNCTION isthmus_job_events_append_only()"
        )
    else:
        for action in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER job_events_no_{action.lower()} BEFORE {action} ON job_events "
                "BEGIN SELECT RAISE(ABORT, 'job_events is append-only'); END"
            )


def downgrade() -> None:
    raise NotImplementedError("Isthmus migrations are forward-only; restore from a backup")
