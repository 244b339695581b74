"""cycle_decisions: the decision log (a job's verdicts per admission cycle); indexes for
pruning admission cycles by age and for usage reports over a time window of the ledger

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
    op.create_index("ix_ledger_at", "ledger_entries", ["at"])


def downgrade() -> None:
    raise NotImplementedError("Isthmus migrations are forward-only; restore from a backup")
