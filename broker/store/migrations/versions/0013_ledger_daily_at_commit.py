"""ledger_daily written by the application at commit, not by a trigger

Revision 0011's trigger added each usage or waste entry to its four rows of ledger_daily at
the entry's insert, so a transaction held those rows (shared by every job of a team and day)
from its first booking to its commit, in its own booking order; on PostgreSQL two reconcile
passes and the other writers of the ledger deadlocked on them under the soak. The application
now notes each entry and writes the sums at commit, last and in key order
(broker/store/daily_sums.py); this revision drops the trigger (and on PostgreSQL its
function). The table holds the same sums: the trigger kept it until now.

Downgrade makes the trigger again (revision 0011's own statements).

Revision ID: 0013
Revises: 0012
"""

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def _revision_0011() -> ModuleType:
    """Revision 0011's module (Alembic loads revisions from files, not as a package)."""
    path = Path(__file__).with_name("0011_ledger_daily.py")
    spec = importlib.util.spec_from_file_location("isthmus_revision_0011", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def upgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS ledger_daily_rollup"
               + (" ON ledger_entries" if op.get_bind().dialect.name == "postgresql" else ""))
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS isthmus_ledger_daily()")


def downgrade() -> None:
    _revision_0011().create_trigger(op.get_bind().dialect.name)
