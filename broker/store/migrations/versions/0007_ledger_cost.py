"""ledger_entries.cost: GPU-hours x flavor cost weight x pool cost weight, numeric

Rows written before this revision keep NULL (their weights were a text note); usage and waste
entries written from now on carry their cost. ALTER TABLE ADD COLUMN on both databases: the
ledger's append-only triggers stay in place (a batch copy of the table would drop them).

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("ledger_entries", sa.Column("cost", sa.Float, nullable=True))


def downgrade() -> None:
    raise NotImplementedError("Isthmus migrations are forward-only; restore from a backup")
