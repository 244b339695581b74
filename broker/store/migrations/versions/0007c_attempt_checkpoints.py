"""attempts.checkpoint_path/_step/_at: the last checkpoint an attempt reported (progress API)

Chained after 0006 under its own revision id, so that another 0007 written at the same time
can land beside it (then one of the two is renumbered to follow the other).

Revision ID: 0007c
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007c"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as b:
        b.add_column(sa.Column("checkpoint_path", sa.String(1024), nullable=True))
        b.add_column(sa.Column("checkpoint_step", sa.Integer, nullable=True))
        b.add_column(sa.Column("checkpoint_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    raise NotImplementedError("Isthmus migrations are forward-only; restore from a backup")
