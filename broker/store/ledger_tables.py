"""The ledger's tables, one home for every module that reads or writes them: the append-only
entries (broker/ledger.py writes them) and their per-day sums that a trigger keeps
(revision 0011; broker/store/reports.py reads both)."""

from __future__ import annotations

import sqlalchemy as sa

from broker.store.tables import LedgerDailyRow, LedgerEntryRow

ENTRIES: sa.Table = LedgerEntryRow.__table__  # type: ignore[attr-defined]
DAILY: sa.Table = LedgerDailyRow.__table__  # type: ignore[attr-defined]
