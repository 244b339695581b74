"""The ledger's entries by kind and time, for the admission's read of the recent releases
(broker.control.admission_usage `_since`, the decayed usage's window read on PostgreSQL)

That read asks for the release entries stamped since a moment (or newer than an id). Without
an index on the time it was a scan of the whole ledger at each read (every REREAD_S): its cost
grew with the history kept, 4 -> 24 ms over the soak's first three minutes, and so on with
every week of jobs. With (kind, at) it is a range of this index, or-ed with the primary key's
range for the ids.

PostgreSQL only: SQLite reads the releases by id alone (one writer at a time takes the ids in
commit order), a range of the primary key.

Revision ID: 0021_ledger_release_time
Revises: 0020_audit_log
"""

from alembic import op

revision = "0021_ledger_release_time"
down_revision = "0020_audit_log"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.create_index("ix_ledger_kind_at", "ledger_entries", ["kind", "at"])


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_index("ix_ledger_kind_at", table_name="ledger_entries")
