"""attempts.checkpoint_path/_step/_at: the last checkpoint an attempt reported (progress API)

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as b:
        b.add_column(sa.Column("checkpoint_path", sa.String(1024), nullable=True))
        b.add_column(sa.Column("checkpoint_step", sa.Integer, nullable=True))
        b.add_column(sa.Column("checkpoint_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    raise NotImplementedError("Isthmus migrations are forward-only; restore from a backup")
