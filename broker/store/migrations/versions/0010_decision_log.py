"""cycle_decisions: the decision log (a job's verdicts per admission cycle), an index for
pruning admission cycles by age; ledger_entries.pool and .submitted_by (usage and waste
entries from now on carry their attempt's pool and job's submitter, so that usage reports
group without joins; older rows keep NULL and reports look those up) and an index for reports
over a time window (on PostgreSQL a partial covering index of the GPU-hour entries)

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cycle_decisions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("cycle_id", sa.Integer, nullable=False),
        sa.Column("job_id", sa.String(16), nullable=False),
        sa.Column("team", sa.String(63), nullable=False),
        sa.Column("admitted", sa.Boolean, nullable=False),
        sa.Column("reason", sa.String(40), nullable=False),
        sa.Column("digest", sa.String(32), nullable=False),
        sa.Column("payload_json", sa.Text, nullable=False),
    )
    op.create_index("ix_cycle_decisions_job", "cycle_decisions", ["job_id", "cycle_id"])
    op.create_index("ix_cycle_decisions_cycle", "cycle_decisions", ["cycle_id"])
    op.create_index("ix_admission_cycles_at", "admission_cycles", ["at"])
    # ALTER TABLE ADD COLUMN on both databases: the append-only triggers stay in place
    op.add_column("ledger_entries", sa.Column("pool", sa.String(63), nullable=True))
    op.add_column("ledger_entries", sa.Column("submitted_by", sa.String(255), nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE INDEX ix_ledger_hours ON ledger_entries (at) INCLUDE (kind, team, flavor, "
            "pool, submitted_by, gpu_hours, cost) "
            "WHERE kind NOT IN ('reserve', 'release')"
        )
    else:
        op.create_index("ix_ledger_at", "ledger_entries", ["at"])
    # the entries booked before this revision, which reports look pool and user up for
    unlabelled = sa.text("kind NOT IN ('reserve', 'release') "
                         "AND (pool IS NULL OR submitted_by IS NULL)")
    op.create_index("ix_ledger_unlabelled", "ledger_entries", ["job_id", "attempt"],
                    postgresql_where=unlabelled, sqlite_where=unlabelled)


def downgrade() -> None:
    raise NotImplementedError("Isthmus migrations are forward-only; restore from a backup")
