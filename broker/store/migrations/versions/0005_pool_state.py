"""pool_state: admin drain/undrain of pools, shared by every replica

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pool_state",
        sa.Column("pool", sa.String(63), primary_key=True),
        sa.Column("drained", sa.Boolean, nullable=False),
        sa.Column("reason", sa.Text, nullable=False, server_default=""),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    raise NotImplementedError("Isthmus migrations are forward-only; restore from a backup")
