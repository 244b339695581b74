"""The audit log: who did what to which target, with what outcome (audit_log)

One row per state-changing API call and per read of another team's data by an admin
(broker/api/audit_trail.py). Rows form a hash chain (`prev_hash` -> `hash`, broker/store/
audit_log.py) that `isthmus db check` verifies; `prev_hash` is unique, so the chain cannot
fork. Triggers refuse UPDATE and DELETE on both databases: the log is append-only for every
client short of one that drops the triggers, and the chain shows what such a client changed.

Downgrade drops the table (and with it the record).

Revision ID: 0020_audit_log
Revises: 0019_job_requeues
"""

import sqlalchemy as sa
from alembic import op

revision = "0020_audit_log"
down_revision = "0019_job_requeues"
branch_labels = None
depends_on = None

_PG_FUNCTION = """
CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only: % refused', TG_OP;
END
$$
"""


def upgrade() -> None:
    op.create_table(
        "audit_log",
        sa.Column("seq", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=255), nullable=False),
        sa.Column("actor_team", sa.String(length=63), nullable=True),
        sa.Column("actor_admin", sa.Boolean(), nullable=False),
        sa.Column("action", sa.String(length=40), nullable=False),
        sa.Column("method", sa.String(length=8), nullable=False),
        sa.Column("route", sa.String(length=255), nullable=False),
        sa.Column("target", sa.String(length=255), nullable=False),
        sa.Column("outcome", sa.String(length=8), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("detail_json", sa.Text(), nullable=True),
        sa.Column("prev_hash", sa.String(length=64), nullable=False),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.UniqueConstraint("prev_hash", name="uq_audit_log_prev_hash"),
    )
    op.create_index("ix_audit_log_at", "audit_log", ["at"])
    op.create_index("ix_audit_log_actor", "audit_log", ["actor", "seq"])
    op.create_index("ix_audit_log_target", "audit_log", ["target", "seq"])
    if op.get_bind().dialect.name == "sqlite":
        for what in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER audit_log_no_{what.lower()} BEFORE {what} ON audit_log "
                f"BEGIN SELECT RAISE(ABORT, 'audit_log is append-only: {what} refused'); END"
            )
    else:
        op.execute(_PG_FUNCTION)
        op.execute(
            "CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE OR TRUNCATE "
            "ON audit_log FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only()"
        )


def downgrade() -> None:
    """Drops the audit log (its record is lost; back the database up first)."""
    if op.get_bind().dialect.name != "sqlite":
        op.execute("DROP TRIGGER audit_log_append_only ON audit_log")
        op.execute("DROP FUNCTION audit_log_append_only()")
    op.drop_index("ix_audit_log_target", "audit_log")
    op.drop_index("ix_audit_log_actor", "audit_log")
    op.drop_index("ix_audit_log_at", "audit_log")
    op.drop_table("audit_log")
