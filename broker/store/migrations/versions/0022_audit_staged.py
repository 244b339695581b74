"""The audit log's staged records (audit_staged): a call's record is written in the call's own
transaction without the chain's lock, and linked to the chain soon after

Until now a call's transaction took the chain's lock (broker/store/audit_log.py) to read the
tail and held it through its COMMIT, so every audited call of every replica waited in one line
for the commits before it: in the 100/s soak a submit's commit waited 5 ms on average for the
lock, an audited read's record 15-19 ms (median). A call now inserts its record here, in its
own transaction (the record commits with what it records, or not at all); a linker
(broker/api/audit_linker.py) moves staged records to the chain's end in transactions of its
own. Triggers refuse UPDATE: a staged record is moved, never changed (DELETE is allowed:
linking moves a record by deleting it here; until then the chain does not cover it).

Downgrade refuses while records wait here (start a server: it links them), then drops the
table.

Revision ID: 0022_audit_staged
Revises: 0021_ledger_release_time
"""

import sqlalchemy as sa
from alembic import op

revision = "0022_audit_staged"
down_revision = "0021_ledger_release_time"
branch_labels = None
depends_on = None

_PG_FUNCTION = """
CREATE FUNCTION audit_staged_no_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_staged records are moved, not changed: UPDATE refused';
END
$$
"""


def upgrade() -> None:
    op.create_table(
        "audit_staged",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True,
                  autoincrement=True),
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
    )
    if op.get_bind().dialect.name == "sqlite":
        op.execute(
            "CREATE TRIGGER audit_staged_no_update BEFORE UPDATE ON audit_staged "
            "BEGIN SELECT RAISE(ABORT, 'audit_staged records are moved, not changed: "
            "UPDATE refused'); END"
        )
    else:
        op.execute(_PG_FUNCTION)
        op.execute(
            "CREATE TRIGGER audit_staged_no_update BEFORE UPDATE ON audit_staged "
            "FOR EACH STATEMENT EXECUTE FUNCTION audit_staged_no_update()"
        )


def downgrade() -> None:
    """Refuses while records are staged (they would be lost); drops the table."""
    if op.get_bind().dialect.name != "sqlite":  # no server still running stages one meanwhile
        op.execute("LOCK TABLE audit_staged IN ACCESS EXCLUSIVE MODE")
    waiting = op.get_bind().execute(sa.text("SELECT count(*) FROM audit_staged")).scalar_one()
    if waiting:
        raise RuntimeError(
            f"{waiting} audit records are staged and not linked to the chain yet: start "
            "`isthmus server` (it links them within seconds), stop it, and downgrade again")
    if op.get_bind().dialect.name != "sqlite":
        op.execute("DROP TRIGGER audit_staged_no_update ON audit_staged")
        op.execute("DROP FUNCTION audit_staged_no_update()")
    op.drop_table("audit_staged")
