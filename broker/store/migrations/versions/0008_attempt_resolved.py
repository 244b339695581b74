"""attempts.resolved_json: what a run actually ran with (image digests, GPU models, nodes),
resolved once when its ranks start, beside the immutable run snapshot

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as b:
        b.add_column(sa.Column("resolved_json", sa.Text, nullable=True))


def downgrade() -> None:
    raise NotImplementedError("Isthmus migrations are forward-only; restore from a backup")
