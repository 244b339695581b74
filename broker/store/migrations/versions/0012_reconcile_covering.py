"""Covering indexes for the reconciler's narrow read (broker.store.attempts.dispatched_brief)

Every reconcile pass reads, for each live dispatched attempt of a backend, its name and phase
and its job's state, reason and current attempt. Without these indexes that is a scan of the
wide attempts rows and, per attempt, a search of the jobs' primary key followed by a read of
the job's row (its spec and all): two b-tree descents and a wide row per attempt.

- ix_attempts_reconcile: the live attempts only (partial: ended_at IS NULL), by backend and
  dispatch state in id order, carrying the columns the read returns, so the read walks one
  range of one index in the order it asks for.
- ix_jobs_lifecycle: the jobs' id with state, reason and attempt, so the join is one index
  search per attempt and no table row.

Both dialects accept these definitions (a partial index, plain key columns).

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_attempts_reconcile", "attempts",
        ["backend", "dispatch", "id", "job_id", "number", "backend_name", "phase", "ended_at"],
        sqlite_where=sa.text("ended_at IS NULL"),
        postgresql_where=sa.text("ended_at IS NULL"),
    )
    op.create_index("ix_jobs_lifecycle", "jobs", ["id", "state", "reason", "attempt"])


def downgrade() -> None:
    raise NotImplementedError("Isthmus migrations are forward-only; restore from a backup")
